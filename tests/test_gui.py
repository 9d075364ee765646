import json
import string
from dataclasses import replace

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given
from hypothesis import strategies as st

from agentrl.envs.gui import GuiEnv
from agentrl.envs.gui.actions import ACTION_TYPES, Action, ActionError, format_call, parse_action
from agentrl.envs.gui.apps import layout
from agentrl.envs.gui.render_fast import draw_screen
from agentrl.envs.gui.state import Route
from agentrl.envs.gui.tasks import TASK_TYPES
from agentrl.envs.gui.ui import HEIGHT, WIDTH


def play_expert(env, seed, limit=30):
    obs, info = env.reset(seed=seed)
    screens = [env.phone.screen()]
    for _ in range(limit):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        screens.append(env.phone.screen())
        if terminated or truncated:
            return reward, terminated, info, screens
    raise AssertionError("episode did not end")


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_expert_solves_every_task_type(task_type):
    env = GuiEnv(task_types=[task_type], screenshots=False)
    for seed in range(12):
        reward, terminated, info, _ = play_expert(env, seed)
        assert terminated and info["success"] and reward == 1.0, (task_type, seed, env.task)


def test_expert_recovers_from_a_detour():
    env = GuiEnv(task_types=["buy_cheapest"], screenshots=False)
    env.reset(seed=5)
    for action in ['open_app("Clock")', "tap(4)", 'open_app("Settings")', 'scroll("down")']:
        env.step(action)
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            break
    assert info["success"] and reward == 1.0


def test_gymnasium_check_env():
    check_env(GuiEnv(), skip_render_check=True)


def test_same_seed_same_episode_and_pixels():
    a, b = GuiEnv(), GuiEnv()
    obs_a, info_a = a.reset(seed=7)
    obs_b, info_b = b.reset(seed=7)
    assert obs_a == obs_b and a.phone.state == b.phone.state
    for _ in range(4):
        action = a.expert_action()
        assert action == b.expert_action()
        obs_a, *_, info_a = a.step(action)
        obs_b, *_, info_b = b.step(action)
        assert obs_a == obs_b
    assert np.array_equal(np.asarray(info_a["image"]), np.asarray(info_b["image"]))
    tasks = {GuiEnv().reset(seed=s)[1]["instruction"] for s in range(20)}
    assert len(tasks) > 10  # seeds give different tasks


def test_junk_actions_never_raise_and_cost_a_step():
    env = GuiEnv(max_steps=300, screenshots=False)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    junk = [
        "",
        "   ",
        "{",
        '{"action_type": "click"}',
        '{"action_type": "click", "index": 999}',
        '{"action_type": "click", "index": true}',
        '{"action_type": "click", "x": -5, "y": 10}',
        '{"action_type": "fly"}',
        '{"action_type": "input_text", "text": "hi"}',
        '{"action_type": "input_text", "text": 5, "index": 2}',
        '{"action_type": "scroll", "direction": "sideways"}',
        '{"action_type": "status", "goal_status": "maybe"}',
        '{"action_type": "open_app", "app_name": "Camera"}',
        "[1, 2, 3]",
        "tap()",
        "tap(1, 2, 3)",
        'tap("x")',
        "type(5)",
        "type(__import__('os'))",
        "explode(3)",
        "scroll(up)",
        "\x00\x01",
    ]
    junk += ["".join(rng.choice(list(string.printable), size=int(rng.integers(1, 40)))) for _ in range(200)]
    for i, action in enumerate(junk):
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward == 0.0
        if terminated:  # random text may spell finish() by chance; start again
            env.reset(seed=i)
    obs, *_ = env.step('{"action_type": "click", "index": 999}')
    assert "Invalid action: there is no element 999" in obs
    obs, *_ = env.step("explode(3)")
    assert "Invalid action: unknown action explode()" in obs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"action_type": "click", "index": 3}', Action("click", index=3)),
        ('Reasoning first.\nAction: {"action_type": "click", "x": 10, "y": 20}', Action("click", x=10, y=20)),
        ('{"action_type": "input_text", "text": "hi", "index": 2, "clear_text": true}',
         Action("input_text", index=2, text="hi", clear_text=True)),
        ('{"action_type": "open_app", "app_name": "Clock"}', Action("open_app", app_name="Clock")),
        ('{"action_type": "status", "goal_status": "complete"}', Action("status", goal_status="complete")),
        ("tap(3)", Action("click", index=3)),
        ("I should open it.\ntap(100, 200)", Action("click", x=100, y=200)),
        ('type("see you at 5")', Action("input_text", text="see you at 5")),
        ('type("a, b", 4)', Action("input_text", text="a, b", index=4)),
        ('type("hi", 4, clear=True)', Action("input_text", text="hi", index=4, clear_text=True)),
        ("long_press(2)", Action("long_press", index=2)),
        ('swipe("up")', Action("swipe", direction="up")),
        ("back()", Action("navigate_back")),
        ("home()", Action("navigate_home")),
        ("enter()", Action("keyboard_enter")),
        ("finish()", Action("status", goal_status="complete")),
        ('answer("555-123-4567")', Action("answer", text="555-123-4567")),
    ],
)  # fmt: skip
def test_parse_action(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"action_type": "click"}', "needs an element index"),
        ('{"action_type": "teleport"}', "unknown action_type"),
        ('{"action_type": "click", "index": 1', "not closed"),
        ('{"action_type": "scroll", "direction": "in"}', "direction must be one of"),
        ("tap(1, 2, 3)", "takes an element index or x, y"),
        ("tap(1, clear=True)", "only type\\(\\) takes clear=True"),
        ('type("hi", 4, clear=print)', "cannot read the arguments"),
        ("hello there", "cannot read an action"),
    ],
)
def test_parse_action_errors_say_what_is_wrong(text, message):
    with pytest.raises(ActionError, match=message):
        parse_action(text)


def test_elements_inside_canvas_and_reachable_by_their_centre():
    env = GuiEnv(screenshots=False)
    for seed in range(24):
        *_, screens = play_expert(env, seed)
        for screen in screens:
            for element in screen.elements:
                x0, y0, x1, y1 = element.bbox
                assert 0 <= x0 < x1 <= WIDTH and 0 <= y0 < y1 <= HEIGHT, element
                if element.interactive:  # a tap on its centre reaches this element, not one drawn over it
                    assert screen.hit(*element.center) == element, (screen.title, element.key)


def test_screenshot_draws_elements_at_their_bbox():
    env = GuiEnv(task_types=["add_contact"])
    env.reset(seed=1)
    env.step('open_app("Contacts")')
    obs, _, _, _, info = env.step(env.expert_action())  # the Create contact form
    image = np.asarray(info["image"])
    assert image.shape == (HEIGHT, WIDTH, 3) and image.std() > 10
    save = env.phone.screen().element("form:save")
    x, y = save.bbox[0] + 30, save.bbox[1] + 8  # on the button face, off its label
    assert tuple(image[y, x]) == (26, 115, 232)
    assert "Screen: Contacts > Create contact" in obs and 'Button text="Save"' in obs


def test_long_lists_need_scrolling():
    env = GuiEnv(screenshots=False)
    env.reset(seed=0)
    obs, *_ = env.step('open_app("Settings")')
    assert '"System"' not in obs and "[scrollable]" in obs
    obs, *_ = env.step('{"action_type": "scroll", "direction": "down"}')
    assert '"System"' in obs
    obs, *_ = env.step('swipe("down")')  # a downward swipe scrolls back up
    assert '"Network & internet"' in obs and '"System"' not in obs


def test_declaring_done_early_fails_and_infeasible_fails():
    env = GuiEnv(task_types=["toggle_setting"], screenshots=False)
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("finish()")
    assert terminated and not truncated and info["success"] is False and reward == 0.0
    env.reset(seed=3)
    while True:  # solve it, then claim it infeasible
        action = env.expert_action()
        if json.loads(action)["action_type"] == "status":
            break
        env.step(action)
    *_, info = env.step('{"action_type": "status", "goal_status": "infeasible"}')
    assert info["success"] is False


def test_wrong_answer_and_wrong_purchase_fail():
    env = GuiEnv(task_types=["contact_phone"], screenshots=False)
    env.reset(seed=2)
    *_, info = env.step('answer("555-000-0000")')
    assert info["success"] is False
    env = GuiEnv(task_types=["buy_cheapest"], screenshots=False)
    env.reset(seed=2)
    task = env.task
    state = env.phone.state
    wrong = next(p for p in state.category(task.category) if p.id != task.product_id)
    env.phone.reset(replace(state, stack=(Route("home"), Route("shop", "product", wrong.id))))
    env.step(f"tap({env.phone.screen().index_of('product:buy')})")
    assert env.phone.state.orders == (wrong.id,)
    *_, info = env.step("finish()")
    assert info["success"] is False


def test_truncation_reports_success_flag():
    env = GuiEnv(max_steps=3, screenshots=False)
    env.reset(seed=0)
    for _ in range(2):
        *_, terminated, truncated, info = env.step("wait()")
        assert not truncated
    obs, reward, terminated, truncated, info = env.step("wait()")
    assert truncated and not terminated and "success" in info


def test_typing_needs_a_focused_field_and_enter_sends():
    env = GuiEnv(task_types=["send_message"], screenshots=False)
    env.reset(seed=4)
    obs, *_ = env.step('type("hello")')
    assert "no text field has the focus" in obs
    env.step('open_app("Messages")')
    contact = env.task.contact
    while env.phone.state.route.page != "thread":
        env.step(env.expert_action())
    field = env.phone.screen().index_of("field:message")
    env.step(f'type("{env.task.text}", {field})')
    obs, *_ = env.step("enter()")
    thread = env.phone.state.thread(contact)
    assert thread.messages[-1].text == env.task.text and thread.messages[-1].outgoing


def test_unknown_renderer_and_task_type_are_clear_errors():
    with pytest.raises(ValueError, match="renderer must be one of"):
        GuiEnv(renderer="opengl")
    with pytest.raises(ValueError, match="unknown task types"):
        GuiEnv(task_types=["fly_to_moon"])


def test_every_screen_draws():
    env = GuiEnv(screenshots=False)
    env.reset(seed=0)
    for route in [Route("settings", "section", "Display"), Route("contacts", "menu", "x"), Route("clock", "new"),
                  Route("shop", "confirmed", "p00"), Route("messages", "thread", "nobody")]:  # fmt: skip
        state = replace(env.phone.state, stack=(Route("home"), route))
        image = np.asarray(draw_screen(layout(state)))
        assert image.shape == (HEIGHT, WIDTH, 3) and image.std() > 5


_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " ,.!?'\"\\()-:éñ", max_size=20)
_ACTIONS = st.one_of(
    st.builds(Action, st.sampled_from(["click", "long_press", "double_tap"]), index=st.integers(0, 99)),
    st.builds(lambda k, x, y: Action(k, x=x, y=y), st.sampled_from(["click", "long_press"]),
              st.integers(0, WIDTH - 1), st.integers(0, HEIGHT - 1)),
    st.builds(lambda t, i, c: Action("input_text", index=i, text=t, clear_text=c), _TEXT,
              st.none() | st.integers(0, 99), st.booleans()),
    st.builds(Action, st.sampled_from(["scroll", "swipe"]), direction=st.sampled_from(["up", "down", "left", "right"])),
    st.builds(Action, st.sampled_from(["navigate_back", "navigate_home", "keyboard_enter", "wait"])),
    st.builds(lambda t: Action("answer", text=t), _TEXT),
    st.builds(lambda a: Action("open_app", app_name=a), st.sampled_from(["Clock", "Settings", "Shop"])),
    st.builds(lambda g: Action("status", goal_status=g), st.sampled_from(["complete", "infeasible"])),
)  # fmt: skip


@given(_ACTIONS)
def test_format_call_is_the_inverse_of_parse_action(action):
    text = format_call(action)
    assert parse_action(text) == action, text


def test_format_call_covers_every_action_type():
    covered = {parse_action(format_call(Action(k, index=0, direction="up", goal_status="complete", app_name="Clock",
                                               text="x"))).action_type for k in ACTION_TYPES}
    assert covered == set(ACTION_TYPES)


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_expert_in_call_format_solves_every_task_type_with_compact_observations(task_type):
    env = GuiEnv(task_types=[task_type], screenshots=False, observation="compact", action_format="call")
    json_env = GuiEnv(task_types=[task_type], screenshots=False)
    for seed in range(6):
        env.reset(seed=seed)
        json_env.reset(seed=seed)
        for _ in range(30):
            action = env.expert_action()
            assert not action.startswith("{") and parse_action(action) == parse_action(json_env.expert_action())
            obs, reward, terminated, truncated, info = env.step(action)
            json_env.step(action)
            if terminated or truncated:
                break
        assert terminated and info["success"] and reward == 1.0, (task_type, seed, env.task)


def test_compact_observation_keeps_indices_and_drops_boxes_and_empty_frames():
    full, compact = GuiEnv(screenshots=False), GuiEnv(screenshots=False, observation="compact")
    chars = {"full": 0, "compact": 0}
    for seed in range(10):
        obs_full, _ = full.reset(seed=seed)
        obs_compact, _ = compact.reset(seed=seed)
        for _ in range(3):  # a few screens into the task
            elements = compact.phone.screen().elements
            lines = obs_compact.split("UI elements:\n", 1)[1].splitlines()
            assert "bbox" not in obs_compact and len(obs_compact) < len(obs_full)
            chars["full"] += len(obs_full)
            chars["compact"] += len(obs_compact)
            shown = {int(line.split(":", 1)[0]): line for line in lines}
            for i, element in enumerate(elements):
                label = element.text or element.content_description or element.hint_text
                if i in shown:  # the same index names the same element in both descriptions
                    assert f"{i}: {element.class_name.rsplit('.', 1)[-1]}" in obs_full
                    assert not label or f'"{label}"' in shown[i]
                else:  # only elements with nothing to read or do are left out
                    assert not label and not element.interactive and not element.is_scrollable
            action = full.expert_action()
            obs_full, *_ = full.step(action)
            obs_compact, *_ = compact.step(action)
    assert chars["compact"] < 0.6 * chars["full"]
    assert "bbox" not in compact.system_prompt and "tap(i)" in compact.system_prompt
    assert full.system_prompt != compact.system_prompt and "bbox" in full.system_prompt


def test_unknown_observation_and_action_format_are_clear_errors():
    with pytest.raises(ValueError, match="observation must be one of full, compact"):
        GuiEnv(observation="pixels")
    with pytest.raises(ValueError, match="action_format must be one of json, call"):
        GuiEnv(action_format="yaml")
