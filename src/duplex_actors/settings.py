"""Settings declared once, as attrs fields whose metadata says how they are set.

A class of settings (``config.ServerConfig``, ``config.ServeOptions``) declares each setting with
:func:`setting`: its type and default (the field), its kind (how text becomes a value and what is
allowed), its environment variable, its ``serve`` flag and its help. From those fields come the
``serve`` flags (:func:`add_flags`), the reading of flags and environment (:func:`load`), the
variables that hand settings to another process (:func:`as_env`) and the table of
docs/operations.md (:func:`markdown_table`).

The rule is the same for every setting: a flag given on the command line, else its environment
variable when set and not empty, else the default. A value that cannot be used raises
:class:`ConfigError`, whose one-line message names the flag or the variable and says what is
allowed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs

T = TypeVar("T")
C = TypeVar("C")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names it and fits on one line."""


def _always(value: Any) -> bool:
    return True


@attrs.frozen
class Kind(Generic[T]):
    """How a setting's text becomes its value, and which values it allows."""

    expects: str  # what is allowed, as it ends an error message: "expected <expects>"
    convert: Callable[[str], T]  # raises ValueError for text it cannot read
    accepts: Callable[[T], bool] = _always  # the check of a value, however it was made
    render: Callable[[T], str] = str  # the value as text that ``convert`` reads back
    choices: tuple[str, ...] | None = None
    # True: the ValueError of ``convert`` says what is wrong better than ``expects`` does
    explains: bool = False

    def parse(self, text: str) -> T:
        """The value of ``text``; ValueError with the reason (``expected ...``) otherwise."""
        try:
            value = self.convert(text)
        except ValueError as exc:
            raise ValueError(str(exc) if self.explains else f"expected {self.expects}") from None
        if not self.accepts(value):
            raise ValueError(f"expected {self.expects}")
        return value


def _bounded(expects: str, at_least: float | None) -> str:
    return expects if at_least is None else f"{expects}, at least {_number_text(at_least)}"


def integer(*, at_least: int | None = None, unit: str = "") -> Kind[int]:
    expects = "an integer" + (f" ({unit})" if unit else "")
    return Kind(
        _bounded(expects, at_least),
        int,
        accepts=lambda v: isinstance(v, int) and (at_least is None or v >= at_least),
    )


def number(*, at_least: float | None = None, unit: str = "") -> Kind[float]:
    expects = "a number" + (f" of {unit}" if unit else "")
    return Kind(
        _bounded(expects, at_least),
        float,
        accepts=lambda v: isinstance(v, (int, float)) and (at_least is None or v >= at_least),
        render=repr,
    )


def _text(value: str) -> str:
    return value


def text(expects: str = "text") -> Kind[str]:
    return Kind(expects, _text)  # any value: a path, say, is taken as its text


def choice(values: Sequence[str]) -> Kind[str]:
    def convert(value: str) -> str:
        if value not in values:
            raise ValueError(value)
        return value

    return Kind(f"one of {', '.join(values)}", convert, accepts=lambda v: v in values, choices=tuple(values))


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def _boolean(value: str) -> bool:
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(value)


BOOLEAN: Kind[bool] = Kind(
    f"{'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}",
    _boolean,
    accepts=lambda v: isinstance(v, bool),
    render=lambda v: "1" if v else "0",
)


@attrs.frozen
class Setting:
    """How one field of a settings class is set (the field holds its type and default)."""

    kind: Kind[Any]
    env: str  # DUPLEX_...
    flag: str | None  # None: no ``serve`` flag (the variable only)
    help: str  # what it sets, for ``--help`` and the table
    details: str = ""  # more for the table of docs/operations.md (too long for ``--help``)
    metavar: str | None = None
    many: bool = False  # a tuple: a repeatable flag, a comma-separated variable
    default_text: str | None = None  # the default in words (needed when it is None or computed)
    group: str | None = None  # the ``serve --help`` section

    @property
    def dest(self) -> str | None:
        """The flag's attribute in argparse's namespace."""
        return None if self.flag is None else self.flag.removeprefix("--").replace("-", "_")

    def value(self, text: str, source: str) -> Any:
        """The value of ``text`` read from ``source`` (a flag or a variable); ConfigError naming it."""
        if self.many:
            items = [item.strip() for item in text.split(",")] if source == self.env else [text]
            return tuple(self._one(item, source) for item in items if item)
        return self._one(text.strip(), source)

    def _one(self, text: str, source: str) -> Any:
        try:
            return self.kind.parse(text)
        except ValueError as exc:
            shown = f"{source}={text!r}" if source == self.env else f"{source} {text!r}"
            raise ConfigError(f"{shown}: {exc}") from None

    def render(self, value: Any) -> str:
        """``value`` as the text of its variable (empty: unset)."""
        if value is None:
            return ""
        if self.many:
            return ",".join(self.kind.render(item) for item in value)
        return self.kind.render(value)


_SETTING = "duplex_actors.setting"


def _check(spec: Setting) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        for item in value if spec.many else (value,):
            if not spec.kind.accepts(item):
                raise ConfigError(f"{attribute.name}={value!r}: expected {spec.kind.expects}")

    return check


def setting(
    default: Any,
    kind: Kind[Any],
    *,
    env: str,
    flag: str | None,
    help: str,
    details: str = "",
    metavar: str | None = None,
    many: bool = False,
    default_text: str | None = None,
    group: str | None = None,
) -> Any:
    """A field of a settings class, declared with everything that sets it."""
    spec = Setting(kind, env, flag, help, details, metavar, many, default_text, group)
    return attrs.field(default=default, validator=_check(spec), metadata={_SETTING: spec})


def settings_of(cls: type) -> list[tuple[attrs.Attribute[Any], Setting]]:
    """The settings of ``cls``, in declaration order."""
    return [(field, field.metadata[_SETTING]) for field in attrs.fields(cls) if _SETTING in field.metadata]


def load(
    cls: Callable[..., C],
    env: Mapping[str, str],
    flags: argparse.Namespace | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> C:
    """``cls`` from ``flags`` (argparse's, from :func:`add_flags`) over ``env`` over ``defaults``
    (which replace the declared defaults) over the declared defaults; ConfigError naming the
    flag or the variable of a bad value."""
    values: dict[str, Any] = {}
    for field, spec in settings_of(cls):  # type: ignore[arg-type]
        given = getattr(flags, spec.dest, None) if flags is not None and spec.dest else None
        if given is not None and given != []:
            assert spec.flag is not None
            values[field.name] = (
                tuple(item for text in given for item in spec.value(text, spec.flag)) if spec.many else given
            )
        elif env.get(spec.env, "").strip():
            values[field.name] = spec.value(env[spec.env], spec.env)
        elif defaults is not None and field.name in defaults:
            values[field.name] = defaults[field.name]
    return cls(**values)


def as_env(settings: Any) -> dict[str, str]:
    """The variables that give another process ``settings`` (:func:`load` reads them back)."""
    return {
        spec.env: spec.render(getattr(settings, field.name)) for field, spec in settings_of(type(settings))
    }


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def default_text(field: attrs.Attribute[Any], spec: Setting) -> str:
    """The default as ``--help`` and the table show it."""
    if spec.default_text is not None:
        return spec.default_text
    value = field.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return _number_text(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"{field.name}: a default of {value!r} needs a default_text")


def _flag_argument(spec: Setting) -> Callable[[str], Any]:
    def argument(text: str) -> Any:
        if spec.many:
            return text  # the items are read with the variable's (load), naming the flag
        try:
            return spec.kind.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{spec.flag} {text!r}: {exc}") from None

    argument.__name__ = spec.dest or "value"
    return argument


def add_flags(parser: argparse.ArgumentParser, classes: Iterable[type]) -> None:
    """A flag on ``parser`` for each setting of ``classes`` that has one, default None (not
    given: the variable, then the default, decide). A bad value raises argparse.ArgumentError
    (with ``exit_on_error=False``) whose message names the flag."""
    groups: dict[str | None, Any] = {None: parser}
    for cls in classes:
        for field, spec in settings_of(cls):
            if spec.flag is None:
                continue
            if spec.group not in groups:
                groups[spec.group] = parser.add_argument_group(spec.group)
            where = f"default: {default_text(field, spec)}; env {spec.env}"
            help_text = f"{spec.help} ({where})".replace("%", "%%")
            target = groups[spec.group]
            if spec.kind is BOOLEAN:
                target.add_argument(
                    spec.flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
                )
            elif spec.many:
                target.add_argument(
                    spec.flag,
                    action="append",
                    type=_flag_argument(spec),
                    default=None,
                    metavar=spec.metavar,
                    help=help_text,
                )
            else:
                target.add_argument(
                    spec.flag,
                    type=_flag_argument(spec),
                    default=None,
                    metavar=spec.metavar
                    or ("{" + ",".join(spec.kind.choices) + "}" if spec.kind.choices else None),
                    help=help_text,
                )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(classes: Iterable[tuple[type, str]]) -> str:
    """The settings of ``classes`` as the Markdown table of docs/operations.md; each class comes
    with a note for its variables (e.g. which entry reads them)."""
    lines = ["| flag | environment | default | what it sets |", "|---|---|---|---|"]
    for cls, note in classes:
        for field, spec in settings_of(cls):
            if spec.flag is None:
                flag = "-"
            elif spec.kind is BOOLEAN:
                flag = f"`{spec.flag}`, `--no-{spec.flag.removeprefix('--')}`"
            else:
                flag = f"`{spec.flag}{' ' + spec.metavar if spec.metavar else ''}`"
                flag += " (repeatable)" if spec.many else ""
            env = f"`{spec.env}`"
            if spec.many:
                env += " (comma-separated)"
            elif spec.kind is BOOLEAN:
                env += f" ({spec.kind.expects})"
            env += note
            default = default_text(field, spec)
            if spec.default_text is None and isinstance(field.default, str):
                default = f"`{default}`"
            meaning = spec.help + (f". {spec.details}" if spec.details else "")
            cells = (flag, env, _cell(default), _cell(meaning))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
