"""OpenEnv both ways: our envs answer OpenEnv's WebSocket protocol, and an OpenEnv server plays as a `TextEnv`.

Served (`agentrl env serve`; `openenv_session` here, on the route `agentrl.envs.server` opens):
``ws://HOST:PORT/NAME/ws`` speaks OpenEnv's session protocol (JSON messages ``{"type": "reset" | "step" | "state" |
"close", "data": ...}``, answers ``{"type": "observation" | "state" | "error", "data": ...}``), so OpenEnv's own
clients (``GenericEnvClient(base_url="http://HOST:PORT/NAME")``, and what builds on them, such as TRL's OpenEnv
integration) play any agentrl env. One connection is one session, bounded and reaped like the HTTP sessions. The
mapping:

* action: OpenEnv actions are typed objects; ours are text. The action schema is ``{"text": str}`` (plus OpenEnv's
  optional ``metadata``); anything else is answered with a ``VALIDATION_ERROR``.
* observation: ``{"text": obs, "terminated", "truncated", "info"}``; ``done = terminated or truncated``;
  ``reward`` is the step's reward (``None`` after reset, as OpenEnv envs do). ``info`` carries ``success``,
  ``tools``, ``task_type``, ``admissible_actions`` (every JSON-serializable key).
* reset data: ``seed`` (the same seed gives the same episode as local play), ``episode_id``, ``options``.
* state: ``{"episode_id", "step_count", "expert_action"}``; the expert action is agentrl's gold next action.
* rubrics: an agentrl env computes its reward inside `step`, so there is no separate rubric; the reward OpenEnv sees
  is that reward, and ``info["success"]`` is the task outcome a rubric would score.

Played (``--env openenv+http://HOST:PORT``): `OpenEnvEnv` drives an OpenEnv server through ``openenv-core``'s own
``GenericEnvClient`` (the openenv extra). The agent's reply becomes the action ``{action_field: text}``
(``--env-arg action_field=message``); the observation's ``observation_field`` (or, by default, ``text`` when the
server sends it, else the whole observation as JSON) is the text the agent reads. OpenEnv has one ``done``: it maps
to ``terminated`` unless the observation says ``truncated`` (our own servers do). ``info["success"]`` is the
observation's ``success`` field when it has one, else ``reward > success_threshold`` on the final step.

What an OpenEnv server sends is checked as `agentrl.envs.remote` checks its own servers: a message over
``max_message_bytes`` (16 MiB) is refused by the WebSocket before it is read; the observation must be a JSON object
free of NaN / Infinity and nested at most `MAX_JSON_DEPTH` deep; the reward null (no reward), a boolean (OpenEnv allows
one) or a finite number within +-``max_abs_reward``; ``done`` (and the observation's ``truncated`` / ``success`` when
sent) JSON booleans; ``info`` a JSON object. A broken answer, a refused or dropped connection and a server error all
raise `agentrl.envs.remote.RemoteEnvError` naming the server (`BadAnswerError` for a broken answer) and drop the
connection (the next reset opens a new one); in a rollout that is a failed env call, counted in ``env_errors``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from agentrl.envs.core import TextEnv
from agentrl.envs.remote import (
    MAX_ABS_REWARD,
    MAX_JSON_DEPTH,
    MAX_RESPONSE_BYTES,
    BadAnswerError,
    RemoteEnvError,
    check_info,
)
from agentrl.extras import needs_extra

if TYPE_CHECKING:  # the server imports `openenv_session`; at run time it hands its refusal class in (`refused`)
    from agentrl.envs.server import EnvServer, _Refused

__all__ = ["OpenEnvEnv", "OPENENV_SCHEME", "openenv_session"]

log = logging.getLogger(__name__)

OPENENV_SCHEME = "openenv+"
"""Prefix of an env id naming an OpenEnv server: ``openenv+http://HOST:PORT``."""

_T = TypeVar("_T")
_WS_MESSAGE_TOO_BIG = 1009  # the WebSocket close code a client sends when a message is over its size limit


# ---- played: an OpenEnv server as a TextEnv --------------------------------------------------------------------------


def _first_bad_number(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Where `value` holds a NaN or an infinity, or nests deeper than `max_depth` (``None``: nowhere).

    OpenEnv's client decodes with Python's lenient `json.loads`, which accepts ``NaN`` and ``Infinity`` and turns
    ``1e400`` into ``inf``; this finds them after the fact. Iterative, so deep nesting cannot hit the recursion limit.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{path or 'the value'} is {item} (JSON has no NaN or Infinity)"
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return f"{path or 'the value'} nests deeper than {max_depth} levels"
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in pairs)
    return None


class OpenEnvEnv(TextEnv):
    """An OpenEnv environment server played as a text env, through openenv-core's own client.

    Args:
        base_url: the OpenEnv server, ``http://HOST:PORT`` (``ws://`` works too).
        action_field: the action field that receives the agent's text.
        observation_field: the observation field the agent reads; empty: ``text`` when present, else the whole
            observation as JSON.
        system_prompt: what the agent is told; empty: the server's description from ``/metadata`` when it has one.
        success_threshold: a final reward above this counts as success when the observation has no ``success``.
        message_timeout: seconds to wait for each answer.
        max_message_bytes: the largest WebSocket message accepted from the server; a larger one fails the call.
        max_abs_reward: the largest reward magnitude accepted.
    """

    system_prompt = "You are an agent acting in an OpenEnv environment. Reply with one action."

    def __init__(self, base_url: str, action_field: str = "text", observation_field: str = "",
                 system_prompt: str = "", success_threshold: float = 0.0, message_timeout: float = 120.0,
                 max_message_bytes: int = MAX_RESPONSE_BYTES, max_abs_reward: float = MAX_ABS_REWARD):
        with needs_extra("an OpenEnv env (openenv+http://...)"):
            from openenv.core.generic_client import GenericEnvClient
        self.base_url = base_url.removeprefix(OPENENV_SCHEME).rstrip("/")
        self.action_field = action_field
        self.observation_field = observation_field
        self.success_threshold = success_threshold
        self.max_message_bytes = max_message_bytes
        self.max_abs_reward = max_abs_reward
        if system_prompt:
            self.system_prompt = system_prompt
        self._client = GenericEnvClient(base_url=self.base_url, message_timeout_s=message_timeout,
                                        max_message_size_mb=max_message_bytes / 2**20).sync()
        self._ask("connect", self._client.connect)
        self._last: dict[str, Any] = {}

    def _ask(self, call: str, fn: Callable[[], _T]) -> _T:
        """Run one client call; every failure becomes a `RemoteEnvError` naming the server (the connection dropped)."""
        try:
            return fn()
        except Exception as e:
            self._drop()
            where = f"OpenEnv server {self.base_url}: {call}"
            if isinstance(e, RecursionError):
                raise BadAnswerError(f"{where} answered JSON nested deeper than the parser allows") from None
            if getattr(getattr(e, "sent", None), "code", None) == _WS_MESSAGE_TOO_BIG:
                raise BadAnswerError(f"{where} answered a message over the limit of {self.max_message_bytes:,} "
                                     f"bytes; raise max_message_bytes (--env-arg) if this env's messages really are "
                                     f"that large") from None
            raise RemoteEnvError(f"{where} failed: {type(e).__name__}: {str(e)[:300]}") from None

    def _drop(self) -> None:
        """Close the connection after a failed call: an answer still on its way must not pass for the next one's."""
        try:
            self._client.close()
        except Exception as e:
            log.debug("closing the OpenEnv client failed: %s", e)

    def _checked(self, call: str, result: Any) -> tuple[dict[str, Any], float | None, bool]:
        """The observation, reward and done flag of a `StepResult`, each checked (`BadAnswerError` otherwise)."""
        where = f"OpenEnv server {self.base_url}: {call}"

        def bad(field: str, problem: str) -> BadAnswerError:
            self._drop()
            return BadAnswerError(f"{where} answered a bad {field!r}: {problem}")

        observation, reward, done = result.observation, result.reward, result.done
        if observation is None:
            observation = {}
        if not isinstance(observation, dict):
            raise bad("observation", f"{type(observation).__name__} where a JSON object belongs")
        problem = _first_bad_number(observation)
        if problem:
            raise bad("observation", problem)
        if reward is not None:
            if not isinstance(reward, (bool, int, float)):
                raise bad("reward", f"{type(reward).__name__} ({str(reward)[:60]}) where a number belongs")
            if not abs(reward) <= self.max_abs_reward:  # False for NaN too
                raise bad("reward", f"{str(reward)[:60]} is not a finite number within +-{self.max_abs_reward:g}")
            reward = float(reward)
        if not isinstance(done, bool):
            raise bad("done", f"{type(done).__name__} ({str(done)[:60]}) where true or false belongs")
        for key in ("truncated", "terminated", "success"):
            if key in observation and not isinstance(observation[key], bool):
                raise bad(f"observation.{key}", f"{type(observation[key]).__name__} where true or false belongs")
        info = observation.get("info")
        if info is not None and not isinstance(info, dict):
            raise bad("observation.info", f"{type(info).__name__} where a JSON object belongs")
        check_info(info or {}, lambda field, problem: bad(f"observation.{field}", problem))
        return observation, reward, done

    def _text(self, observation: dict[str, Any]) -> str:
        field = self.observation_field or ("text" if "text" in observation else "")
        if field:
            value = observation.get(field, "")
            return value if isinstance(value, str) else json.dumps(value)
        return json.dumps(observation, sort_keys=True)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Reset the OpenEnv session (``seed`` goes along; OpenEnv envs that honour it replay the same episode)."""
        super().reset(seed=seed)
        data: dict[str, Any] = {} if seed is None else {"seed": seed}
        if options:
            data["options"] = options
        result = self._ask("reset", lambda: self._client.reset(**data))
        observation, _, _ = self._checked("reset", result)
        self._last = observation
        info = dict(observation.get("info") or {})
        return self._text(observation), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send ``{action_field: action}``; map OpenEnv's ``(observation, reward, done)`` onto Gymnasium's five."""
        result = self._ask("step", lambda: self._client.step({self.action_field: action}))
        observation, reward, done = self._checked("step", result)
        self._last = observation
        reward = reward or 0.0
        info = dict(observation.get("info") or {})
        truncated = observation.get("truncated", False) and done
        terminated = done and not truncated
        if "success" not in info and "success" in observation:
            info["success"] = observation["success"]
        if done:
            info.setdefault("success", reward > self.success_threshold)
        return self._text(observation), reward, terminated, truncated, info

    def expert_action(self) -> str:
        """The server's expert action from its state (agentrl servers send one; other OpenEnv servers do not)."""
        state = self._ask("state", self._client.state)
        action = state.get("expert_action") if isinstance(state, dict) else None
        if not isinstance(action, str):
            raise NotImplementedError(f"the OpenEnv server at {self.base_url} sends no expert_action in its state")
        return action

    def close(self) -> None:
        """Close the WebSocket session."""
        try:
            self._client.close()
        except Exception as e:  # closing a dead connection must not fail the runner
            log.debug("closing the OpenEnv client failed: %s", e)


# ---- served: an agentrl env answering OpenEnv's clients (the route is in agentrl.envs.server) ------------------------


def _openenv_error(message: str, code: str) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code}})


def _openenv_observation(answer: dict[str, Any], reward: float | None) -> str:
    terminated, truncated = bool(answer.get("terminated")), bool(answer.get("truncated"))
    observation = {"text": answer["observation"], "terminated": terminated, "truncated": truncated,
                   "info": answer["info"]}
    return json.dumps({"type": "observation",
                       "data": {"observation": observation, "reward": reward, "done": terminated or truncated}})


async def openenv_session(server: EnvServer, websocket: Any, refused: type[_Refused]) -> None:
    """One OpenEnv WebSocket session on `server`, an env of its own until the client closes or goes idle.

    The mapping between OpenEnv's messages and the env's calls is in this module's docstring. `refused` is the
    server's refusal (`agentrl.envs.server._Refused`: an HTTP status and a message), passed in rather than imported
    so that this module never imports the server, which imports this handler.
    """
    # Here, not at the top: the played side (`OpenEnvEnv`, in rollout workers) needs no Starlette.
    from starlette.websockets import WebSocketDisconnect

    await websocket.accept()
    try:
        session = await server.open_session({}, kind="openenv")
    except refused as e:
        code = "CAPACITY_REACHED" if e.status == 503 else "FACTORY_ERROR"
        await websocket.send_text(_openenv_error(e.message, code))
        await websocket.close(code=1013 if e.status == 503 else 1011)
        return
    idle = server.settings.idle_timeout
    try:
        while True:
            try:
                frame = await asyncio.wait_for(websocket.receive(), idle)
            except asyncio.TimeoutError:  # idle for too long: reaped like an HTTP session
                server.reaped += 1
                await websocket.close(code=1000, reason=f"session idle for {idle:.0f}s")
                return
            if session.id not in server.sessions:  # failed (504/500) or closed under us
                await websocket.send_text(_openenv_error("the session is gone; reconnect", "SESSION_ERROR"))
                await websocket.close(code=1011)
                return
            if frame["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(frame.get("code", 1000))
            session.last_used = time.monotonic()
            raw = frame.get("text")
            if raw is None:  # a binary frame: unsupported data (1003), said in the protocol's own error first
                await websocket.send_text(_openenv_error("binary frames are not part of the protocol; send each "
                                                         "message as a JSON text frame", "INVALID_JSON"))
                await websocket.close(code=1003, reason="binary frame")
                return
            try:
                message = json.loads(raw)
                if not isinstance(message, dict):
                    raise ValueError("a message must be a JSON object")
            except RecursionError:  # nested past the interpreter's depth: hostile, not a typo (1007: bad payload)
                await websocket.send_text(_openenv_error("Invalid JSON: nested too deep; messages are flat JSON "
                                                         "objects", "INVALID_JSON"))
                await websocket.close(code=1007, reason="JSON nested too deep")
                return
            except ValueError as e:
                await websocket.send_text(_openenv_error(f"Invalid JSON: {e}", "INVALID_JSON"))
                continue
            kind, data = message.get("type"), message.get("data", {})
            if kind == "close":  # the client is done: a close frame (1000), never a dropped connection (1006)
                await websocket.close(code=1000)
                break
            try:
                reply = await _openenv_answer(server, session, kind, data, refused)
            except refused as e:
                reply = _openenv_error(e.message, "EXECUTION_ERROR" if e.status >= 500 else "VALIDATION_ERROR")
            await websocket.send_text(reply)
    except WebSocketDisconnect:
        pass
    finally:
        await server.close_session(session.id)


async def _openenv_answer(server: EnvServer, session: Any, kind: Any, data: Any, refused: type[_Refused]) -> str:
    """The reply to one OpenEnv message (raises `refused` for a bad one)."""
    if not isinstance(data, dict):
        raise refused(422, "data must be a JSON object")
    async with session.lock:
        if kind == "reset":
            seed = data.get("seed")
            if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64):
                raise refused(422, f"seed must be an integer in [0, 2**64), got {str(seed)[:64]!r}")
            options = data.get("options")
            answer = await server.reset(session, seed, options if isinstance(options, dict) else None)
            if isinstance(data.get("episode_id"), str):
                session.episode_id = data["episode_id"][:255]
            return _openenv_observation({**answer, "terminated": False, "truncated": False}, None)
        if kind == "step":
            extra = set(data) - {"text", "metadata"}
            if not isinstance(data.get("text"), str) or extra:
                raise refused(422, f"an action is {{'text': str}} (this env's actions are text); got keys "
                                    f"{sorted(data)}")
            if session.episode_id == "":
                raise refused(422, "step before reset: send a reset message first")
            answer = await server.step(session, data["text"])
            return _openenv_observation(answer, answer["reward"])
        if kind == "state":
            expert = None
            if session.episode_id:
                try:
                    expert = await server.expert_action(session)
                except refused:
                    raise
                except Exception as e:  # an env without an expert still has a state
                    log.debug("expert_action failed: %s", e)
            state = {"episode_id": session.episode_id or None, "step_count": session.steps,
                     "expert_action": expert}
            return json.dumps({"type": "state", "data": state})
    raise refused(422, f"Unknown message type: {kind!r} (reset, step, state, close)")
