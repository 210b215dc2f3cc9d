"""A clock you advance by hand and a command runner that answers from a script."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from hpcrun.runner import CommandResult


class FakeClock:
    """A :class:`hpcrun.clock.Clock` whose time moves only when told (``sleep`` advances it)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._wall = start
        self._mono = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self._wall

    def monotonic(self) -> float:
        return self._mono

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self._wall += seconds
        self._mono += seconds


Responder = Callable[[Sequence[str]], CommandResult | None]


class FakeRunner:
    """A :class:`hpcrun.runner.CommandRunner` that records calls and answers by first word(s).

    ``FakeRunner({"squeue": "123 RUNNING\\n"})`` answers any ``squeue ...`` with that stdout.
    A value may be a string (stdout, exit 0), a :class:`CommandResult`, or a callable taking argv.
    Unknown commands exit 127, like a shell.
    """

    def __init__(
        self, answers: Mapping[str, str | CommandResult | Responder] | None = None
    ) -> None:
        self.answers = dict(answers or {})
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, input: str | None = None,
            env: Mapping[str, str] | None = None, timeout: float | None = None) -> CommandResult:
        argv = tuple(argv)
        self.calls.append(argv)
        for n in range(len(argv), 0, -1):
            answer = self.answers.get(" ".join(argv[:n]))
            if answer is not None:
                return self._resolve(argv, answer)
        return CommandResult(argv=argv, returncode=127, stdout="",
                             stderr=f"{argv[0]}: command not found")

    @staticmethod
    def _resolve(argv: tuple[str, ...], answer: str | CommandResult | Responder) -> CommandResult:
        if isinstance(answer, str):
            return CommandResult(argv=argv, returncode=0, stdout=answer, stderr="")
        if isinstance(answer, CommandResult):
            return answer
        result = answer(argv)
        return result if result is not None else CommandResult(
            argv=argv, returncode=0, stdout="", stderr="")
