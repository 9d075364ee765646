"""`GuiEnv`: a mocked Android phone as a `TextEnv` (AndroidWorld-style observations and actions).

Departures from AndroidWorld, and why:
    * The phone is a set of small state machines (`apps.py`), not an emulator: thousands of episodes per minute
      on a laptop, and success is checked on typed app state instead of by querying an emulator's databases.
    * Screens are 360x800 (a phone at 1x); AndroidWorld's are 1080x2400 device pixels. Coordinates in `click`
      are pixels of `info["image"]`.
    * `open_app` is an instant launch (like AndroidWorld's adb intent); every other gesture goes through the
      renderer: the fast one hit-tests in Python, the browser one lets Chromium decide what was hit.
    * Like AndroidWorld, success is judged on the final state when the episode ends, whether the agent declared
      `complete` or the step budget ran out; declaring `infeasible` is always a failure (every task is feasible).

The success check runs under a hard budget (``reward_budget_s``, 5 s by default): in a worker process of
`agentrl.budget` that is killed past the budget, since it reads what the agent typed and answered. A check that hits
the budget is a failure (reward 0) and the final step's ``info`` has ``grade_budget_exceeded`` True and
``grade_refused`` saying why; ``grade_budget_exceeded`` is False on every other final step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar

from agentrl import budget
from agentrl.envs.core import ClientSetting, Difficulty, TextEnv

from .actions import Action, ActionError, format_call, parse_action
from .phone import Phone
from .render_browser import BrowserHost, BrowserRenderer  # Playwright itself loads only when a browser starts
from .render_fast import FastRenderer
from .renderer import Renderer
from .state import APPS, generate_world
from .tasks import TASK_TYPES, Task, check_task, sample_task
from .ui import HEIGHT, WIDTH, Screen

__all__ = ["GuiEnv"]

_RENDERERS = ("fast", "browser")
_OBSERVATIONS = ("full", "compact")
_ACTION_FORMATS = ("json", "call")
_SWIPE_TO_SCROLL = {"up": "down", "down": "up", "left": "right", "right": "left"}
DEFAULT_REWARD_BUDGET_S = 5.0
"""Seconds one success check may take in its worker process before it is killed and counted as a failure."""

_logger = logging.getLogger(__name__)

SYSTEM_PROMPT = f"""You operate an Android phone to complete a task. Each turn you see the task and the screen as a \
numbered list of UI elements (class, text, flags, pixel bbox on a {WIDTH}x{HEIGHT} screen). Reply with exactly one \
action, either as AndroidWorld JSON or as a function call:
- {{"action_type": "click", "index": 3}} or tap(3); by position: {{"action_type": "click", "x": 180, "y": 400}}
- {{"action_type": "long_press", "index": 3}} or long_press(3)
- {{"action_type": "input_text", "text": "hello", "index": 5, "clear_text": true}} or type("hello", 5); \
type("hello") types into the focused field
- {{"action_type": "scroll", "direction": "down"}} or scroll("down") (shows what is further down)
- {{"action_type": "navigate_back"}} or back(); {{"action_type": "navigate_home"}} or home()
- {{"action_type": "keyboard_enter"}} or enter(); {{"action_type": "wait"}} or wait()
- {{"action_type": "open_app", "app_name": "Contacts"}} or open_app("Contacts"); apps: {", ".join(APPS)}
- {{"action_type": "answer", "text": "..."}} or answer("...") for a question (this ends the episode)
- {{"action_type": "status", "goal_status": "complete"}} or finish() when the task is done; \
{{"action_type": "status", "goal_status": "infeasible"}} if it cannot be done."""


# For `observation="compact"`: the same phone in ~40% of the tokens, actions shown as calls (JSON still parses).
COMPACT_SYSTEM_PROMPT = f"""You operate an Android phone to complete a task. Each turn you see the task and the \
screen as a numbered list of UI elements. Reply with exactly one action:
tap(i) | long_press(i) | type("text", i) | scroll("down") | scroll("up") | back() | home() | enter() | \
open_app("name") with name one of {", ".join(APPS)} | answer("...") to answer a question | finish() when the task \
is done"""


def _make_renderer(renderer: str | Renderer, shared: Any) -> Renderer:
    if isinstance(renderer, Renderer):
        return renderer
    if renderer == "fast":
        return FastRenderer()
    if renderer == "browser":
        host = shared if isinstance(shared, BrowserHost) else BrowserHost.default()
        return BrowserRenderer(host)
    raise ValueError(f"renderer must be one of {', '.join(_RENDERERS)}, got {renderer!r}")


class GuiEnv(TextEnv):
    """A mocked mobile phone (Settings, Contacts, Messages, Clock, Shop) driven by AndroidWorld-style actions.

    Args:
        renderer: ``"fast"`` (Pillow, in-process; the default) or ``"browser"`` (HTML in headless Chromium through
            Playwright; needs /usr/bin/chromium).
        max_steps: step budget; the episode is truncated when it runs out.
        task_types: restrict tasks to these types (see `tasks.TASK_TYPES`); all by default.
        screenshots: put a screenshot in `info["image"]` on every step (turn off to save time when nobody looks).
        observation: ``"full"`` (AndroidWorld's element fields with pixel boxes; the default) or ``"compact"`` (no
            boxes or empty layout frames, same indices, a short system prompt): ~40% of the tokens, for
            small text agents that act by index.
        action_format: how `expert_action` writes actions: ``"json"`` (AndroidWorld JSON) or ``"call"``
            (``tap(3)``, 4 tokens instead of ~12). Both parse either way.
        shared: a `BrowserHost` to open pages in (runner pools build one per process through `GuiEnv.shared`);
            by default browser envs share a module-level one.
        reward_budget_s: the most seconds the success check may take, in a worker process that is killed past it
            (`agentrl.budget`); such an episode fails and the step's ``info`` has ``grade_budget_exceeded`` True.
            None checks in this process, without the budget (trusted use only). The operator's setting: a client of
            a served env cannot set it.

    Difficulty (`difficulty_levels`, for curricula): the eight task types, ordered by the mean length of the expert's
    solution over 30 generated phones each (3 steps for disable_alarm up to 6 for add_contact and set_alarm), narrowed
    to ``task_types`` when given (`difficulty_for`): a seed that asks for a level draws a task of that type.
    """

    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    difficulty_levels: ClassVar[Difficulty | None] = Difficulty(
        ("disable_alarm", "contact_phone", "toggle_setting", "delete_contact", "send_message", "buy_cheapest",
         "add_contact", "set_alarm"), "the task type, ordered by the length of the expert's solution")
    difficulty_narrowed_by: ClassVar[str | None] = "task_types"
    # Screens answer the agent's taps: as tool results they keep Qwen3's token prefix, so an episode trains as one
    # sample, not one per step (see agentrl.chat.layout).
    rollout_defaults: ClassVar[dict[str, Any]] = {"observation_role": "tool"}
    shared: ClassVar[type[BrowserHost]] = BrowserHost  # free to build: Chromium starts on the first browser page
    # Playwright's sync API belongs to the thread that started the browser: runner pools step every GuiEnv of a
    # process from one thread (see agentrl.rollout.pool).
    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "single_thread": True}
    # What a client of a served phone may set per session: data only; the renderer (a browser to start) and the
    # shared browser host are the operator's. `task_types` takes one type from a client (a list only from the operator).
    client_settings: ClassVar[Mapping[str, ClientSetting]] = {
        "max_steps": ClientSetting(int, "step budget per episode", min=1, max=100),
        "task_types": ClientSetting(str, "draw only tasks of this type", choices=TASK_TYPES),
        "screenshots": ClientSetting(bool, "render a screenshot on every step (images do not travel over HTTP)"),
        "observation": ClientSetting(str, "full (AndroidWorld fields) or compact screens", choices=_OBSERVATIONS),
        "action_format": ClientSetting(str, "how expert actions are written", choices=_ACTION_FORMATS),
    }

    def __init__(
        self,
        renderer: str | Renderer = "fast",
        max_steps: int = 25,
        task_types: tuple[str, ...] | list[str] | None = None,
        screenshots: bool = True,
        shared: Any = None,
        observation: str = "full",
        action_format: str = "json",
        reward_budget_s: float | None = DEFAULT_REWARD_BUDGET_S,
    ):
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        if isinstance(task_types, str):  # one type given bare (--env-arg task_types=...)
            task_types = [task_types]
        if observation not in _OBSERVATIONS:
            raise ValueError(f"observation must be one of {', '.join(_OBSERVATIONS)}, got {observation!r}")
        if action_format not in _ACTION_FORMATS:
            raise ValueError(f"action_format must be one of {', '.join(_ACTION_FORMATS)}, got {action_format!r}")
        if reward_budget_s is not None and (
            isinstance(reward_budget_s, bool)
            or not isinstance(reward_budget_s, (int, float))
            or not 0 < reward_budget_s < math.inf
        ):
            raise ValueError(f"reward_budget_s must be a positive number of seconds or None, got {reward_budget_s!r}")
        self.reward_budget_s = reward_budget_s
        if reward_budget_s is not None:
            # Workers started from now on import the checker's module up front: a check costs a pipe round trip,
            # not an import inside its budget.
            budget.preload(check_task.__module__)
        self.observation = observation
        self.action_format = action_format
        self._describe = Screen.describe_compact if observation == "compact" else Screen.describe
        if observation == "compact":
            self.system_prompt = COMPACT_SYSTEM_PROMPT
        self.task_types = tuple(task_types) if task_types else TASK_TYPES
        unknown = [t for t in self.task_types if t not in TASK_TYPES]
        if unknown:
            raise ValueError(f"unknown task types {unknown}; choose from {', '.join(TASK_TYPES)}")
        self.levels = self.difficulty_for({"task_types": self.task_types})
        self.max_steps = max_steps
        self.screenshots = screenshots
        self.renderer = _make_renderer(renderer, shared)
        self.phone: Phone | None = None
        self.task: Task | None = None
        self._steps = 0
        self._done = False

    # ------------------------------------------------------------------ gym API

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Draw a new phone and task from `self.np_random`; the phone starts on the home screen."""
        super(TextEnv, self).reset(seed=seed)
        level, _ = self.levels.split(seed)
        state = generate_world(self.np_random)
        self.task = sample_task(self.np_random, state, self.task_types if level is None else (level,))
        if self.phone is None:
            self.phone = Phone(state)
        else:
            self.phone.reset(state)
        self.renderer.attach(self.phone)
        self._steps = 0
        self._done = False
        return self._observe("The phone shows the home screen."), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action; malformed ones cost a step and get an explanation instead of an error."""
        if self.task is None or self.phone is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; call reset()")
        self._steps += 1
        answer: str | None = None
        terminated = False
        try:
            parsed = parse_action(action)
            if parsed.action_type == "status":
                terminated = True
                feedback = f"You declared the task {parsed.goal_status}."
            elif parsed.action_type == "answer":
                terminated, answer = True, parsed.text
                feedback = f"You answered: {parsed.text}"
            else:
                feedback = self._perform(parsed)
        except ActionError as e:
            feedback = f"Invalid action: {e}"
        truncated = not terminated and self._steps >= self.max_steps
        info = self._info()
        reward = 0.0
        if terminated or truncated:
            self._done = True
            declared_infeasible = terminated and answer is None and "infeasible" in feedback
            refused = None
            if declared_infeasible:
                success = False
            else:
                success, refused = self._check(answer)
            info["success"] = success
            info["grade_budget_exceeded"] = refused is not None
            if refused is not None:
                info["grade_refused"] = refused
            reward = 1.0 if success else 0.0
        return self._observe(feedback), reward, terminated, truncated, info

    def expert_action(self) -> str:
        """The gold next action from the current state, in `action_format`; it also recovers from detours."""
        if self.task is None or self.phone is None:
            raise RuntimeError("call reset() before expert_action()")
        action = self.task.expert(self.phone.state, self.phone.screen())
        return format_call(parse_action(action)) if self.action_format == "call" else action

    def close(self) -> None:
        """Release the renderer (the browser page, if any)."""
        self.renderer.close()

    # ------------------------------------------------------------------ internals

    def _check(self, answer: str | None) -> tuple[bool, str | None]:
        """The task's success on the final state: ``(success, None)``, or ``(False, why)`` past the budget."""
        if self.reward_budget_s is None:
            return self.task.check(self.phone.state, answer), None
        try:
            return bool(budget.run_with_budget(check_task, self.task, self.phone.state, answer,
                                               budget_s=self.reward_budget_s)), None
        except budget.BudgetExceeded as e:
            _logger.warning("gui: %s; the episode counts as failed", e)
            return False, f"the success check ran past its budget of {self.reward_budget_s:g} s"

    def _perform(self, action: Action) -> str:
        """Carry out a gesture through the renderer and say what happened."""
        screen = self.phone.screen()
        before = self.phone.version
        kind = action.action_type
        if kind in ("click", "double_tap", "long_press"):
            x, y = self._target(screen, action)
            if kind == "long_press":
                self.renderer.long_press(x, y)
            else:
                for _ in range(2 if kind == "double_tap" else 1):
                    self.renderer.tap(x, y)
        elif kind == "input_text":
            if action.index is not None:
                element = self._element(screen, action.index)
                if not element.is_editable:
                    raise ActionError(f"element {action.index} ({element.text or element.class_name}) is not a text "
                                      "field.")  # fmt: skip
                self.renderer.tap(*element.center)
            elif not self.phone.state.route.focused:
                raise ActionError("no text field has the focus; give the index of the field to type into.")
            self.renderer.type_text(action.text, action.clear_text)
        elif kind in ("scroll", "swipe"):
            direction = action.direction if kind == "scroll" else _SWIPE_TO_SCROLL[action.direction]
            if action.index is not None:
                x, y = self._element(screen, action.index).center
            else:
                lists = [e for e in screen.elements if e.is_scrollable]
                x, y = lists[0].center if lists else (WIDTH // 2, HEIGHT // 2)
            self.renderer.scroll(x, y, direction)
        elif kind == "navigate_back":
            self.renderer.tap(*screen.element("nav:back").center)
        elif kind == "navigate_home":
            self.renderer.tap(*screen.element("nav:home").center)
        elif kind == "keyboard_enter":
            self.renderer.enter()
        elif kind == "open_app":
            if self.phone.open_app(action.app_name) is None:
                raise ActionError(f"no app named {action.app_name!r}; installed apps: {', '.join(APPS)}.")
            self.renderer.refresh()
        elif kind == "wait":
            return "You waited."
        return "Done." if self.phone.version != before else "Nothing changed on the screen."

    @staticmethod
    def _element(screen: Screen, index: int):
        if not 0 <= index < len(screen.elements):
            raise ActionError(f"there is no element {index}; this screen has elements 0 to {len(screen.elements) - 1}.")
        return screen.elements[index]

    def _target(self, screen: Screen, action: Action) -> tuple[int, int]:
        if action.index is not None:
            return self._element(screen, action.index).center
        if not (0 <= action.x < WIDTH and 0 <= action.y < HEIGHT):
            raise ActionError(f"({action.x}, {action.y}) is off the {WIDTH}x{HEIGHT} screen.")
        return action.x, action.y

    def _observe(self, feedback: str) -> str:
        screen = self.phone.screen()
        return (
            f"Task: {self.task.instruction()}\n"
            f"Step {self._steps}/{self.max_steps}. {feedback}\n"
            f"Screen: {screen.title}\n"
            f"UI elements:\n{self._describe(screen)}"
        )

    def _info(self) -> dict[str, Any]:
        screen = self.phone.screen()
        info: dict[str, Any] = {
            "task_type": self.task.task_type,
            "instruction": self.task.instruction(),
            "screen": screen.title,
            "ui_elements": [e.as_dict(i) for i, e in enumerate(screen.elements)],
        }
        if self.screenshots:
            info["image"] = self.renderer.screenshot()
        return info
