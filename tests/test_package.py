"""The package's public names, imported on first use."""

from __future__ import annotations

import pytest

import bert_tasks


def test_every_public_name_resolves_to_its_module() -> None:
    assert sorted(bert_tasks.__all__) == sorted(bert_tasks._EXPORTS)
    for name in bert_tasks.__all__:
        value = getattr(bert_tasks, name)
        assert getattr(value, "__module__", bert_tasks._EXPORTS[name]).startswith(bert_tasks._EXPORTS[name])
    assert set(bert_tasks.__all__) <= set(dir(bert_tasks))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        bert_tasks.Trainer  # noqa: B018
