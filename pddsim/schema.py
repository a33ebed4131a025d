"""The base of every validated model, and the one way a raw tree or a YAML file becomes a model:
errors are one InputError line naming the file and the field."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from pddsim.errors import InputError


class Strict(BaseModel):
    """A schema node: unknown fields are errors (a typo never passes silently)."""

    model_config = ConfigDict(extra="forbid")


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], raw: Any, origin: str) -> M:
    """Validate a raw tree; errors become one InputError line naming the field (an unknown field
    first: it is usually the cause of the others)."""
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        errors = e.errors()
        first = next((err for err in errors if err["type"] == "extra_forbidden"), errors[0])
        loc = ".".join(str(p) for p in first["loc"])
        msg = first["msg"]
        if first["type"] == "value_error":  # a rule of a whole model: its message says what is wrong
            msg = msg.removeprefix("Value error, ")
            place = f"{loc}: " if loc else ""
        else:
            place = f"{loc or '(top level)'}: "
        more = f" (+{e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise InputError(f"{origin}: {place}{msg}{more}") from None


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file's tree; an unreadable or malformed file is one InputError line."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise InputError(f"{path}: cannot read {what} ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{line}: not valid YAML ({str(e).splitlines()[0]})") from None
    except ValueError:                       # the loader's int() of a number past the digit limit
        raise InputError(f"{path}: {TOO_MANY_DIGITS}") from None


TOO_MANY_DIGITS = f"an integer of more than {sys.get_int_max_str_digits()} digits"


def load_model(model: type[M], path: Path, what: str) -> M:
    """A YAML file validated into `model`, with field-precise errors."""
    return validated(model, read_yaml(path, what), str(path))
