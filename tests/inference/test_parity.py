"""The ONNX export's parity check keeps each task's own labels: a multi-label model's thresholded sets, not
an argmax; a regression model's values by their tolerance alone. The exporters' root-logger handler goes."""

from __future__ import annotations

import logging

import numpy as np

from bert_tasks.inference.onnx_export import Parity, _silenced
from bert_tasks.tasks.sentiment import SentimentTask


def test_multi_label_parity_compares_the_thresholded_label_sets() -> None:
    """The argmax of every window is kept, but half the windows' sets change at the saved thresholds."""
    task = SentimentTask(multi_label=True, thresholds=[0.5, 0.9])
    reference = [np.array([3.0, 2.0]), np.array([3.0, 2.0])]  # sigmoid(2.0) = 0.88 < 0.9: {label 0}
    found = [np.array([3.0, 2.3]), np.array([3.0, 2.0])]  # sigmoid(2.3) = 0.91: {label 0, label 1}
    parity = Parity.measure(reference, found, "int8", task.window_labels)
    assert parity.close and parity.agreement == 0.5 and not parity.passed
    assert Parity.measure(reference, found, "int8").agreement == 1.0  # what argmax alone said
    assert "50.00% keep their label" in str(parity)


def test_regression_parity_is_the_values_tolerance() -> None:
    task = SentimentTask(regression=True)
    reference = [np.array([3.1]), np.array([4.0])]
    within = Parity.measure(reference, [np.array([3.2]), np.array([4.1])], "int8", task.window_labels)
    assert within.agreement is None and within.passed
    assert "keep their label" not in str(within) and "largest logit difference 0.1" in str(within)
    beyond = Parity.measure(reference, [np.array([3.1]), np.array([9.0])], "int8", task.window_labels)
    assert not beyond.passed


def test_a_handler_the_exporters_add_to_the_root_logger_is_removed() -> None:
    """onnxruntime's quantizer configures the root logger; every later line then printed twice."""
    root = logging.getLogger()
    before = list(root.handlers)
    with _silenced():
        root.addHandler(logging.StreamHandler())
    assert root.handlers == before
