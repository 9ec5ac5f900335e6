"""Hub datasets for users online: one way to name them (`path/config`, e.g. `glue/sst2`) and load a split.

Only the hub code path uses this; defaults, tests and CI read local files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bert_tasks.errors import BertTasksError

if TYPE_CHECKING:
    from datasets import Dataset

_LOAD_ERRORS = (FileNotFoundError, ValueError, ConnectionError)


def _path_and_config(dataset_id: str) -> tuple[str, str | None]:
    hub_path, _, config_name = dataset_id.partition("/")
    return hub_path, config_name or None


def hub_split_names(dataset_id: str) -> list[str]:
    """The splits a hub dataset has (NER reads whichever of train/validation/test exist)."""
    from datasets import get_dataset_split_names  # deferred: only the online path needs the hub machinery

    try:
        return list(get_dataset_split_names(*_path_and_config(dataset_id)))
    except _LOAD_ERRORS as e:
        raise BertTasksError(f"dataset={dataset_id}: cannot list its splits ({e}); check the id") from e


def load_hub_split(dataset_id: str, split: str, columns: Sequence[str], setting: str) -> Dataset:
    """One split, checked to have `columns`; `setting` names the config keys that choose them."""
    from datasets import load_dataset  # deferred: only the online path needs the hub machinery

    where = f"dataset={dataset_id} ({split})"
    try:
        data = load_dataset(*_path_and_config(dataset_id), split=split)
    except _LOAD_ERRORS as e:
        raise BertTasksError(f"{where}: cannot load ({e}); check the id and split") from e
    missing = [column for column in columns if column not in data.column_names]
    if missing:
        raise BertTasksError(
            f"{where}: no column {', '.join(missing)} (has {', '.join(data.column_names)}); set {setting}"
        )
    return data
