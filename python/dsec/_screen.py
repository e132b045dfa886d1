"""``sandbox.screen``: the screen, mouse and keyboard of a VM (backend ``vm``), in the action
vocabulary computer-use agents speak. Coordinates are screen pixels from the top left; the API
checks every action (a bad one is a ``InvalidArgumentError`` naming its field, and nothing is sent)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from .sandbox import Sandbox


@dataclass(frozen=True)
class Screenshot:
    """A screenshot: PNG bytes and the screen's size in pixels."""

    png: bytes
    width: int
    height: int


@dataclass(frozen=True)
class InputResult:
    """What an input request did: actions performed and the screen size they were taken against."""

    performed: int
    width: int
    height: int


class Screen:
    """The screen of one sandbox."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def capture(self) -> Screenshot:
        """A screenshot (PNG). A paused VM shows its screen as it was."""
        reply = self._sb._t.request("GET", self._sb._route("/screen"), accept="image/png")
        return Screenshot(reply.body, int(reply.headers.get("x-screen-width", 0)), int(reply.headers.get("x-screen-height", 0)))

    def actions(self, actions: Sequence[Dict[str, Any]]) -> InputResult:
        """Performs actions in order, e.g. ``[{"action": "left_click", "x": 10, "y": 20}, {"action": "type", "text": "hi"}]``."""
        reply = self._sb._t.request("POST", self._sb._route("/input"), json_body={"actions": list(actions)}).json()
        return InputResult(reply["performed"], reply["width"], reply["height"])

    def click(self, x: int, y: int) -> InputResult:
        """Left click at (x, y)."""
        return self.actions([{"action": "left_click", "x": x, "y": y}])

    def double_click(self, x: int, y: int) -> InputResult:
        return self.actions([{"action": "double_click", "x": x, "y": y}])

    def right_click(self, x: int, y: int) -> InputResult:
        return self.actions([{"action": "right_click", "x": x, "y": y}])

    def middle_click(self, x: int, y: int) -> InputResult:
        return self.actions([{"action": "middle_click", "x": x, "y": y}])

    def move(self, x: int, y: int) -> InputResult:
        """Moves the pointer to (x, y)."""
        return self.actions([{"action": "mouse_move", "x": x, "y": y}])

    def drag(self, path: Sequence[Tuple[int, int]]) -> InputResult:
        """Presses the left button at the first point, moves through the others, releases at the last."""
        return self.actions([{"action": "drag", "path": [{"x": x, "y": y} for x, y in path]}])

    def scroll(self, x: int, y: int, dy: int = 0, dx: int = 0) -> InputResult:
        """Turns the wheel at (x, y): ``dy`` > 0 scrolls down, ``dx`` > 0 right, in wheel steps."""
        return self.actions([{"action": "scroll", "x": x, "y": y, "dx": dx, "dy": dy}])

    def key(self, keys: str) -> InputResult:
        """Presses a key chord: ``"Return"``, ``"ctrl+alt+t"``, ``"shift+Tab"`` (xdotool names)."""
        return self.actions([{"action": "key", "keys": keys}])

    def type(self, text: str) -> InputResult:
        """Types text on a US keyboard layout (a character without a key is refused, naming its index)."""
        return self.actions([{"action": "type", "text": text}])

    def wait(self, ms: int) -> InputResult:
        return self.actions([{"action": "wait", "ms": ms}])


__all__: List[str] = ["InputResult", "Screen", "Screenshot"]
