"""Configs of a user's job from a file of ``DELAYCOMM_*`` settings (``run --config-file FILE``)::

    # comments and blank lines are ignored
    [gloo]                        # a section with no setting: nothing configured (the reference)

    [tail-ssp2]
    DELAYCOMM_DELAY = pareto:p50=2ms,p99=40ms
    DELAYCOMM_STALENESS = ssp:2

A section ``[name]`` starts a config (a name of letters, digits, ``_``, ``.``, ``-``; each once); each following
``DELAYCOMM_<OPTION> = value`` line is one of its settings, exactly as the environment variable would say it. Every
section is checked as delaycomm checks its environment at init (``delaycomm.resolve``): an unknown variable, a bad
value, or ``DELAYCOMM_SEED`` / ``DELAYCOMM_STATS`` (the experiment sets those per run) is an error naming the
file, the line and what is accepted.
"""

from __future__ import annotations

import re

from delaycomm.experiment.script import ScriptConfig

__all__ = ["parse_config_file", "check_name", "RESERVED", "NAME_SYNTAX"]

RESERVED = ("DELAYCOMM_SEED", "DELAYCOMM_STATS")
NAME_SYNTAX = "letters, digits, _ . - (at most 40, starting with a letter or digit)"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,39}\Z")
_SECTION = re.compile(r"\[\s*([^\]]*?)\s*\]\Z")


def check_name(name: str, where: str) -> str:
    """A config's name, which also names its folder of results.

    Raises:
        ValueError: a name that is not accepted, naming ``where``.
    """
    if not _NAME.match(name):
        raise ValueError(f"{where}: config name {name!r} is not accepted; expected {NAME_SYNTAX}")
    return name


def _check_section(path: str, line: int, name: str, env: dict[str, str]) -> None:
    from delaycomm._config import resolve

    try:
        resolve(env=env)
    except ValueError as e:
        raise ValueError(f"{path}:{line}: config [{name}]: {e}") from None


def parse_config_file(path: str) -> list[ScriptConfig]:
    """The configs of ``path``, in file order.

    Raises:
        ValueError: an unreadable file, a line outside a section, a bad name, a repeated section or variable, a
            variable that is not a delaycomm option or is reserved, a value delaycomm refuses; each names the file
            and the line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"argument --config-file: {path!r} cannot be read ({e})") from None
    configs: list[ScriptConfig] = []
    current: tuple[str, int, dict[str, str]] | None = None

    def close() -> None:
        if current is not None:
            name, line, env = current
            _check_section(path, line, name, env)
            configs.append(ScriptConfig(name, dict(env), f"{len(env)} setting(s) from {path}", f"{path}:{line}"))

    for number, raw in enumerate(lines, 1):
        text = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("DELAYCOMM_") else raw.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{path}:{number}"
        m = _SECTION.match(text)
        if m:
            close()
            name = check_name(m.group(1), where)
            if any(c.name == name for c in configs):
                raise ValueError(f"{where}: config [{name}] is defined twice")
            current = (name, number, {})
            continue
        if current is None:
            raise ValueError(f"{where}: {text!r} is outside a section; start a config with [name]")
        key, eq, value = text.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key.startswith("DELAYCOMM_"):
            raise ValueError(f"{where}: {text!r} is not DELAYCOMM_<OPTION> = value")
        if key in RESERVED:
            raise ValueError(
                f"{where}: {key} is set by the experiment for every run (the seed, the stats files); "
                "leave it out of the config file"
            )
        if key in current[2]:
            raise ValueError(f"{where}: {key} is set twice in config [{current[0]}]")
        current[2][key] = value
    close()
    if not configs:
        raise ValueError(f"argument --config-file: {path!r} defines no config; start one with [name]")
    return configs
