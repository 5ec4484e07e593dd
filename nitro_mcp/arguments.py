"""How the tools read loosely typed arguments, one rule for all of them.

Tool arguments are validated by the SDK in pydantic's lax mode, where a number given as a
string (``seed="3"``, ``wait_s="5"``) is the number it spells. ``overrides`` reach an
experiment whose config is strict (the record must hold exactly what trained), so the same
rule is applied to them here, before the experiment is built: a string that spells a JSON
number (or ``true``/``false``) is taken as that value when the field takes no string, and a
float with an integral value is an int for an int field. Anything else is left for the
experiment to refuse with its own message.

Flags are strict: a boolean parameter takes a JSON boolean only, so ``dry_run="no"`` or
``force=1`` is refused with the JSON to send, never read as the boolean it may spell.
``resume`` and ``restore_best`` take booleans as well as their strings: ``false`` is
``'false'``, and ``restore_best=true`` is ``'true'``; ``resume=true`` is ambiguous and
refused, naming what to send, and so is a string that spells a boolean in other words
(``resume="no"``, ``restore_best="yes"``).

Each tool's arguments are one pydantic model (:func:`arguments_model`: a call model such as
``TrainCall`` with the tool's own parameters added, or the tool function's signature), which
refuses an unknown argument by name. A refused argument (a value of the wrong type or out of
its bounds, a required one missing, an unknown one) is answered in the same words as a
refused override, not in pydantic's: ``seed='7x' is not an integer; send e.g. seed=0.``, or
in the words of the field's own ``Refusal`` (:func:`argument_errors`).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model
from pydantic import model_validator as _model_validator

from nitro_core.errors import ConfigError
from nitro_core.experiment import Experiment
from nitro_core.jobs.call_models import Refusal
from nitro_mcp.echo import clip, clip_text


def coerce_overrides(cls: type[Experiment], overrides: dict[str, Any]) -> None:
    """Rewrite, in place, each override that the rule above turns into a value its field
    takes (unknown fields and values that fit are left alone)."""
    for name, value in list(overrides.items()):
        field = cls.model_fields.get(name)
        if field is None or field.annotation is None:
            continue
        candidate = _candidate(value)
        if candidate is _NONE:
            continue
        adapter: TypeAdapter[Any] = TypeAdapter(field.annotation)
        if not _fits(adapter, value) and _fits(adapter, candidate):
            overrides[name] = candidate


def flag_text(value: bool | str, keyword: str) -> str:
    """``resume`` or ``restore_best`` as the string the job spec and the core take."""
    if value is True and keyword == "resume":
        raise ConfigError(
            "resume=true is ambiguous; send resume='auto' (continue the latest record, or start "
            "fresh when there is none) or a source such as resume='latest => latest'."
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    word = value.strip().lower().removeprefix(":") if isinstance(value, str) else ""
    if (word in _FALSE_WORDS or word in _TRUE_WORDS) and value not in _SPELLED:
        raise ConfigError(f"{keyword}={json.dumps(value)} {_FLAG_WORD[keyword]}")
    return value


_SPELLED = ("true", "false", ":true", ":false")  # the grammar's own words: the core reads them
_FLAG_WORD = {
    "resume": 'is a string that spells a boolean, not a source: send {"resume": false} (a new '
    'run), {"resume": "auto"} (continue the latest record, or start fresh) or a source such as '
    '{"resume": "latest => latest"}.',
    "restore_best": 'is a string that spells a boolean, not an average: send {"restore_best": '
    'false}, {"restore_best": true} (end holding the run\'s best checkpoint) or an average such '
    'as {"restore_best": "Average(Last(10))"}.',
}


_NONE = object()


def _candidate(value: Any) -> Any:
    """The value ``value`` would be under the rule, or ``_NONE`` when the rule does not apply."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, str) or len(value) > 100:
        return _NONE
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return _NONE
    return parsed if isinstance(parsed, bool | int | float) else _NONE


def _fits(adapter: TypeAdapter[Any], value: Any) -> bool:
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


_KIND = {"integer": "an integer", "number": "a number", "boolean": "true or false",
         "string": "a string", "array": "a list", "object": "an object"}  # fmt: skip
_SAMPLE = {
    "integer": 0,
    "number": 1.0,
    "boolean": True,
    "string": "...",
    "array": [],
    "object": {"max_epochs": 3},
}


class _Arguments(BaseModel):
    """The arguments of a tool that has no call model: its signature's parameters."""

    model_config = ConfigDict(extra="forbid")


def arguments_model(
    tool: str, base: type[BaseModel] = _Arguments, **fields: Any
) -> type[BaseModel]:
    """The model of ``tool``'s arguments: ``base``'s fields and ``fields`` (as
    ``create_model`` takes them), refusing an unknown argument by name."""

    def known(cls: type[BaseModel], data: Any) -> Any:
        if isinstance(data, dict):
            names = [info.alias or name for name, info in cls.model_fields.items()]  # as sent
            unknown = sorted(set(data) - set(names))
            if unknown:
                raise ValueError(
                    f"unknown argument {unknown[0]!r}; {tool} takes: {', '.join(names)}"
                )
        return data

    # pydantic makes ``known`` a classmethod (its first parameter is ``cls``); the descriptor
    # it returns is what create_model takes, though typed there as a callable
    validators: dict[str, Any] = {"_known": _model_validator(mode="before")(known)}
    model: type[BaseModel] = create_model(
        f"{tool}Arguments", __base__=base, __validators__=validators, **fields
    )
    return model


def signature_model(fn: Callable[..., Any]) -> type[BaseModel]:
    """The arguments model of a tool function: one field per parameter but the context."""
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn, eval_str=True).parameters.values():
        if not _is_context(param.annotation):
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (param.annotation, default)
    return arguments_model(fn.__name__, **fields)


def flat(fn: Callable[..., Any], model: type[BaseModel]) -> Callable[..., Any]:
    """``fn(arguments, ctx)`` as a tool function with one parameter per field of ``model``
    (the call's parameters flat, as an agent sends them) and the context, for the SDK."""

    @functools.wraps(fn)
    async def tool(ctx: Context | None = None, **arguments: Any) -> Any:
        return await fn(model.model_validate(arguments), ctx)

    params = [
        inspect.Parameter(
            info.alias or name, inspect.Parameter.KEYWORD_ONLY,
            default=info.get_default(call_default_factory=True) if not info.is_required()
            else inspect.Parameter.empty,
            annotation=model.model_fields[name].rebuild_annotation(),
        )
        for name, info in model.model_fields.items()
    ]  # fmt: skip
    ctx = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, default=None,
                            annotation=Context | None)  # fmt: skip
    returns = inspect.signature(fn, eval_str=True).return_annotation
    del tool.__wrapped__  # the signature is this one, not fn's
    tool.__signature__ = inspect.Signature([*params, ctx], return_annotation=returns)  # type: ignore[attr-defined]
    tool.__annotations__ = {p.name: p.annotation for p in (*params, ctx)} | {"return": returns}
    return tool


def _is_context(annotation: Any) -> bool:
    arms = getattr(annotation, "__args__", (annotation,))
    return any(isinstance(a, type) and issubclass(a, Context) for a in arms)


def argument_errors(model: type[BaseModel], exc: ValidationError) -> str:
    """A refusal of a call's arguments as one sentence per argument, each naming what the
    argument takes and a value to send (or the field's own ``Refusal``); ``model`` is the
    tool's arguments model."""
    schema = _schema(model)
    fields = {info.alias or name: info for name, info in model.model_fields.items()}
    parts: dict[str, str] = {}  # one per argument: a union reports each of its arms
    for err in exc.errors():
        if err["type"] == "value_error" and not err["loc"]:  # the server's own model check
            parts.setdefault("", str(err.get("ctx", {}).get("error", err["msg"])))
            continue
        if err["type"] == "value_error" and len(err["loc"]) > 1:  # a nested model's own
            said = str(err.get("ctx", {}).get("error", err["msg"]))  # check (slurm's options)
            parts.setdefault(".".join(map(str, err["loc"])), said.rstrip("."))
            continue
        inside = _place(schema, err["loc"]) if len(err["loc"]) > 1 else None
        if inside is not None:  # in a nested model: an unknown option, a value of a wrong type
            parts.setdefault(_path(err["loc"]), _nested_error(schema, err, inside))
            continue
        name = str(err["loc"][0]) if err["loc"] else "arguments"
        refusal = _refusal(fields.get(name))
        if refusal is not None and err["type"] in _OUT_OF_BOUNDS:
            parts.setdefault(name, refusal.say(clip(err.get("input"))).rstrip("."))
            continue
        prop = _resolved(schema, schema.get("properties", {}).get(name, {}))
        if err["type"] == "bool_type" and [a.get("type") for a in _arms(prop)] == ["boolean"]:
            parts.setdefault(name, _not_a_boolean(name, err.get("input"), prop))
            continue
        if err["type"] == "missing":
            text = f"{name} is required"
        else:
            text = f"{name}={clip(err.get('input'))} is not {_expected(prop)}"
        parts.setdefault(name, f"{text}; send e.g. {name}={_value(_example(prop))}")
    return "; ".join(parts.values()) + "."


def _nested_error(schema: dict[str, Any], err: Any, prop: dict[str, Any]) -> str:
    """A refusal inside a nested model (``slurm={"partiton": ...}``; ``prop``: the schema
    at its place) in the words of a top-level one: an unknown option named with what the
    model takes, else what the value is not and one to send."""
    loc, path = err["loc"], _path(err["loc"])
    if err["type"] == "extra_forbidden":
        names = _object(schema, _place(schema, loc[:-1]) or {}).get("properties", {})
        return f"unknown argument {path!r}; {_path(loc[:-1])} takes: {', '.join(names)}"
    prop = _resolved(schema, prop)
    text = f"{path}={clip(err.get('input'))} is not {_expected(prop)}"
    return f"{text}; send e.g. {path}={_value(_example(prop))}"


def _place(schema: dict[str, Any], loc: tuple[Any, ...]) -> dict[str, Any] | None:
    """The schema at ``loc``: an argument, an option of a nested model or an item of a list
    (``slurm``, ``slurm.account``, ``slurm.extra[0]``; ``{}`` for an option the model does
    not have); None where the schema has no such place (a union's arm: ``resume.bool``)."""
    prop = schema
    for depth, part in enumerate(loc):
        node = _object(schema, prop) if depth else schema
        found: dict[str, Any] | None = None
        if isinstance(part, int):
            found = node.get("items")
        elif "properties" in node:
            found = node["properties"].get(part)
            if found is None and 0 < depth == len(loc) - 1:
                found = {}  # an option the model does not have: a typo
        if found is None:
            return None
        prop = found
    return prop


def _path(loc: tuple[Any, ...]) -> str:
    """``slurm.extra[0]``: an argument's place as a caller writes it."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def _object(schema: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any]:
    """The arm of ``prop`` that is an object or a list (a nested model, maybe optional)."""
    for arm in prop.get("anyOf", [prop]):
        arm = _deref(schema, arm)
        if "properties" in arm or "items" in arm:
            return arm
    return {}


def _resolved(schema: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any]:
    """``prop`` with each arm that refers to a definition (a nested model) replaced by it."""
    if "anyOf" not in prop:
        return _deref(schema, prop)
    return {**prop, "anyOf": [_deref(schema, arm) for arm in prop["anyOf"]]}


def _deref(schema: dict[str, Any], prop: dict[str, Any]) -> dict[str, Any]:
    ref = prop.get("$ref", "")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return dict(schema.get("$defs", {}).get(ref.removeprefix("#/$defs/"), {}))
    return prop


# a value of the right type outside the field's bounds or closed set: its Refusal says it
_OUT_OF_BOUNDS = frozenset(
    {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "literal_error"}
)


@functools.cache
def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True)


def _refusal(info: Any) -> Refusal | None:
    return next((m for m in getattr(info, "metadata", ()) if isinstance(m, Refusal)), None)


_FALSE_WORDS = ("false", "no", "n", "off", "f", "0")
_TRUE_WORDS = ("true", "yes", "y", "on", "t", "1")


def _not_a_boolean(name: str, given: Any, prop: dict[str, Any]) -> str:
    """A flag sent as anything but a JSON boolean (``dry_run="no"``): refused, never read as
    the boolean it may spell, with the JSON to send (the one it spells, when it spells one)."""
    word = given.strip().lower() if isinstance(given, str) and len(given) < 10 else None
    if isinstance(given, int | float) and given in (0, 1):
        word = str(int(given))
    if word in _FALSE_WORDS or word in _TRUE_WORDS:
        send = json.dumps({name: word in _TRUE_WORDS})
    else:
        send = f"{json.dumps({name: True})} or {json.dumps({name: False})}"
    meaning = str(prop.get("description") or "").rstrip(".")
    return (
        f"{name} must be true or false (a JSON boolean), not {_shown_value(given)}: send {send}"
        + (f" ({meaning})" if meaning else "")
    )


def _shown_value(value: Any) -> str:
    if isinstance(value, str):
        return f"the string {json.dumps(clip_text(value), ensure_ascii=False)}"
    if isinstance(value, int | float):
        return f"the number {clip(value)}"
    if value is None:
        return "null"
    return "a list" if isinstance(value, list) else "an object"


def _arms(prop: dict[str, Any]) -> list[dict[str, Any]]:
    arms = prop.get("anyOf", [prop])
    return [a for a in arms if a.get("type") != "null"] or [prop]


def _expected(prop: dict[str, Any]) -> str:
    words = []
    for arm in _arms(prop):
        if "enum" in arm:
            words.append("one of " + ", ".join(_value(v) for v in arm["enum"]))
        else:
            words.append(_KIND.get(arm.get("type", ""), "a valid value"))
    return " or ".join(dict.fromkeys(words))


def _example(prop: dict[str, Any]) -> Any:
    if prop.get("default") is not None:
        return prop["default"]
    arm = _arms(prop)[0]
    if arm.get("properties"):  # a nested model: its first option
        first, sub = next(iter(arm["properties"].items()))
        return {first: _example(sub)}
    return arm["enum"][0] if "enum" in arm else _SAMPLE.get(arm.get("type", ""), "...")


def _value(value: Any) -> str:
    """A value as a tool call writes it: JSON, strings in single quotes."""
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value)
