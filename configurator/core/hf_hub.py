"""A Hugging Face model id (``meta-llama/Llama-3.1-8B``) as a ``--model``: its ``config.json``
fetched with ``huggingface_hub`` (an optional dependency: ``pip install huggingface_hub`` or
``configurator[hf]``), nothing else of the repository.

``hf_hub_download`` keeps the file in the Hugging Face cache (``HF_HOME`` / ``HF_HUB_CACHE``)
and reads it from there when ``HF_HUB_OFFLINE=1``; a gated model needs its licence accepted
and a token (``hf auth login`` or ``HF_TOKEN``). Every failure is one
:class:`~configurator.core.errors.InputError` (field ``model``) naming the id.
"""

from __future__ import annotations

import os
import re

from configurator.core.errors import InputError

#: ``owner/name``: the shape of a Hugging Face repository id (letters, digits, ``-``, ``_``,
#: ``.``; at most 96 characters each side; huggingface_hub's ``validate_repo_id``), and not
#: a model file's name (``dir/model.yaml``).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def looks_like_hub_id(ref: str) -> bool:
    """Whether ``ref`` has the shape of a Hugging Face model id (``owner/name``, not ending in
    ``.json``/``.yaml``/``.yml``); the caller has already ruled out a preset and an existing
    path."""
    return (isinstance(ref, str) and _REPO_ID.fullmatch(ref) is not None
            and not ref.lower().endswith(_FILE_SUFFIXES) and ".." not in ref)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def _error_classes():
    """huggingface_hub's error classes (``huggingface_hub.errors``, or ``.utils`` before
    0.23), by name; an absent one is a class nothing raises."""
    try:
        from huggingface_hub import errors as mod
    except ImportError:     # huggingface_hub < 0.23
        from huggingface_hub import utils as mod

    class _Never(Exception):
        pass

    return {name: getattr(mod, name, _Never) for name in (
        "GatedRepoError", "RepositoryNotFoundError", "RevisionNotFoundError",
        "EntryNotFoundError", "LocalEntryNotFoundError", "HFValidationError",
        "HfHubHTTPError")}


def hub_config_path(repo_id: str) -> str:
    """The local path of ``repo_id``'s ``config.json``: from the Hugging Face cache, or
    downloaded into it (``huggingface_hub.hf_hub_download``; only that file).

    Raises :class:`InputError` (field ``model``, one line): huggingface_hub not installed;
    offline (``HF_HUB_OFFLINE``) or the Hub unreachable with no cached copy; no such
    repository (or private); a gated repository without access; no ``config.json`` in it.
    """
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise InputError("model", repo_id, "a Hugging Face model id needs huggingface_hub: "
                                           "pip install huggingface_hub") from None
    err = _error_classes()
    try:
        return hf_hub_download(repo_id, "config.json")
    except err["LocalEntryNotFoundError"]:
        if _offline():
            rule = ("HF_HUB_OFFLINE is set and the Hugging Face cache holds no config.json of "
                    "it: run once online, or give a config.json file")
        else:
            rule = ("the Hugging Face Hub cannot be reached and the cache holds no config.json "
                    "of it: check the network, or give a config.json file")
        raise InputError("model", repo_id, rule) from None
    except err["GatedRepoError"]:
        raise InputError("model", repo_id, "a gated model: accept its licence on "
                         "huggingface.co, then log in (hf auth login, or HF_TOKEN)") from None
    except err["RepositoryNotFoundError"]:
        raise InputError("model", repo_id, "no such Hugging Face model (or it is private: "
                         "log in with hf auth login, or set HF_TOKEN)") from None
    except err["RevisionNotFoundError"]:
        raise InputError("model", repo_id, "the repository has no main revision") from None
    except err["EntryNotFoundError"]:
        raise InputError("model", repo_id, "the repository has no config.json") from None
    except err["HFValidationError"]:
        raise InputError("model", repo_id, "not a valid Hugging Face model id") from None
    except (err["HfHubHTTPError"], OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise InputError("model", repo_id, f"cannot fetch its config.json: {first}") from None
