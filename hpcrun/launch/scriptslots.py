"""What may go into each slot of a job script, and how it is quoted there (pure).

Every value of a spec or a site config that reaches a job script goes through one function of
this module for its slot, so no value can add a directive, split an argument or disarm a guard:

- a **directive** (``#SBATCH --key=value``) and a **comment**: one line; a newline would end the
  directive and run the rest as a command, so any control character is refused;
- a **word** (an argument, an exported value, a module name, a container image or mount on
  the agents' ``srun``): one line, shell-quoted (:func:`word`, :func:`option_word`);
- a **command** the site means as shell (``python``, ``srun_extra_flags``): one line, kept as the
  site wrote it (it is the site admin's own shell), control characters refused;
- a **setup line**: run through ``eval`` of its quoted text, so a comment or a ``;`` inside it
  cannot cut the failure guard off; in a multi-line value every line is guarded (the first
  failing command ends the job, as under ``set -e``).

A refusal is a :class:`~hpcrun.errors.ConfigError` naming the key, what was found and the fix:
admission renders the script before anything is created, so it reaches the user at submit.
"""

from __future__ import annotations

import re
import shlex

from hpcrun.errors import ConfigError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, C1, line breaks
_OPTION_NAME = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_-]*$")
_CONTROL_BUT_NEWLINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(value: object, *, key: str) -> str:
    """``value`` as text for a one-line slot.

    Raises:
        ConfigError: it holds a newline or another control character.
    """
    text = str(value)
    found = _CONTROL.search(text)
    if found is not None:
        raise ConfigError(f"{key} {text!r} holds the control character {found.group()!r}; a "
                          "job-script value is one line of printable text: remove it")
    return text


def word(value: object, *, key: str) -> str:
    """``value`` as one shell word (one line, quoted)."""
    return shlex.quote(one_line(value, key=key))


def option_word(arg: str, *, key: str) -> str:
    """``arg`` as one shell word; a ``--name=value`` option keeps its name bare and quotes only
    its value (``--container-image='nvcr.io#nvidia/pytorch:24.05-py3'``), as readable and as
    safe.

    Raises:
        ConfigError: it holds a newline or another control character.
    """
    name, eq, value = one_line(arg, key=key).partition("=")
    if eq and _OPTION_NAME.match(name):
        return f"{name}={shlex.quote(value)}"
    return shlex.quote(arg)


def directive(flag: str, value: str, *, bare: str = "") -> str:
    """``--flag=value`` for an ``#SBATCH`` line (``--flag`` when ``value`` is ``bare``)."""
    one_line(flag, key="sbatch option")
    if value == bare:
        return f"--{flag}"
    return f"--{flag}={word(value, key=f'sbatch --{flag}')}"


def env_name(name: str) -> str:
    """``name`` for ``export NAME=...``.

    Raises:
        ConfigError: not a shell variable name.
    """
    if not _ENV_NAME.match(name):
        raise ConfigError(f"site env name {name!r} is not a variable name; expected letters, "
                          "digits and _ (not starting with a digit): rename it")
    return name


def guarded_setup(line: str, *, key: str = "setup") -> str:
    """A site setup line that ends the job when it fails, whatever it holds.

    Raises:
        ConfigError: it holds a control character other than a newline or a tab.
    """
    found = _CONTROL_BUT_NEWLINES.search(line)
    if found is not None:
        raise ConfigError(f"{key} line {line!r} holds the control character "
                          f"{found.group()!r}; remove it")
    quoted = shlex.quote(line)
    if "\n" not in line:
        # parsed first (bash -n): a syntax error inside eval can end bash before `||` runs
        return (f"bash -n -c {quoted} 2>/dev/null && eval {quoted} || {{ echo \"hpcrun: site "
                f"setup line failed:\" {quoted} >&2; exit 1; }}")
    # several lines: eval's status is the last command's, so an earlier failing line would
    # pass; an ERR trap armed around the eval ends the job at the first failing command (not
    # in a function's body, nor in a condition: what `set -e` would stop at, with a message)
    failed = 'echo "hpcrun: site setup line failed:" "$hpcrun_setup" >&2; exit 1'
    return "\n".join([f"hpcrun_setup={quoted}",
                      f'bash -n -c "$hpcrun_setup" 2>/dev/null || {{ {failed}; }}',
                      f"trap {shlex.quote(failed)} ERR",
                      'eval "$hpcrun_setup"',
                      "trap - ERR"])
