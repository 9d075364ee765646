"""Browser renderer tests: real headless Chromium through Playwright (skipped where /usr/bin/chromium is absent)."""

import os

import numpy as np
import pytest

from agentrl.envs.gui import GuiEnv
from agentrl.envs.gui.render_browser import CHROMIUM, BrowserHost

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)"
    ),
]

# Touches every gesture: launch, scroll, long press and its menu, taps by index and by x,y, typing into a focused
# field, keyboard enter, back, home, plus malformed actions that must change nothing.
SCRIPT = [
    'open_app("Contacts")',
    'scroll("down")',
    "long_press(5)",
    "back()",
    "tap(2)",
    '{"action_type": "input_text", "text": "Zoe Park", "index": 2}',
    'type("555-123-4567", 3)',
    "tap(not a number)",
    '{"action_type": "click", "x": 284, "y": 272}',
    "home()",
    'open_app("Messages")',
    "tap(3)",
    'type("see you at 5", 4)',
    "enter()",
    'type("again")',
    '{"action_type": "input_text", "text": "replaced", "clear_text": true}',
    "back()",
    "back()",
    'swipe("up")',
]


@pytest.fixture(scope="module")
def host():
    host = BrowserHost()
    yield host
    host.close()


def test_browser_plays_a_task_with_a_real_screenshot(host):
    env = GuiEnv(renderer="browser", task_types=["send_message"], shared=host)
    obs, info = env.reset(seed=11)
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            break
    assert terminated and info["success"] and reward == 1.0
    image = np.asarray(info["image"])
    assert image.shape == (800, 360, 3) and image.std() > 10  # not blank
    for element in info["ui_elements"]:
        box = element["bbox_pixels"]
        assert 0 <= box["x_min"] < box["x_max"] <= image.shape[1] and 0 <= box["y_min"] < box["y_max"] <= image.shape[0]
    # The send button is drawn where the observation says it is: its face is the app's blue.
    send = env.phone.screen().element("thread:send")
    x, y = send.bbox[0] + 6, send.center[1]
    assert np.abs(image[y, x].astype(int) - (26, 115, 232)).max() < 20
    thread = env.phone.state.thread(env.task.contact)
    assert thread.messages[-1].text == env.task.text
    env.close()


@pytest.mark.parametrize("task_type", ["delete_contact", "buy_cheapest"])
def test_browser_long_press_and_scrolling_tasks(host, task_type):
    env = GuiEnv(renderer="browser", task_types=[task_type], shared=host, screenshots=False)
    env.reset(seed=3)
    for _ in range(20):
        *_, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            break
    assert info["success"], env.task
    env.close()


def test_same_seed_and_actions_same_state_in_both_renderers(host):
    fast = GuiEnv(renderer="fast", screenshots=False)
    browser = GuiEnv(renderer="browser", shared=host, screenshots=False)
    obs_f, _ = fast.reset(seed=21)
    obs_b, _ = browser.reset(seed=21)
    assert obs_f == obs_b
    for action in SCRIPT:
        obs_f, *_ = fast.step(action)
        obs_b, *_ = browser.step(action)
        assert obs_b == obs_f, action
        assert browser.phone.state == fast.phone.state, action
    state = fast.phone.state
    assert state.contact("Zoe Park") is not None and state.contact("Zoe Park").phone == "555-123-4567"
    assert any(m.text == "see you at 5" for t in state.threads for m in t.messages)
    browser.close()


def test_envs_share_one_browser(host):
    envs = [GuiEnv(renderer="browser", shared=host, screenshots=False) for _ in range(3)]
    for seed, env in enumerate(envs):
        env.reset(seed=seed)
    browser = host._browser
    assert browser is not None and len(browser.contexts) >= 3
    for env in envs:
        env.step('open_app("Clock")')
        assert env.phone.state.route.app == "clock"
        env.close()
    assert host._browser is browser


def test_the_phone_server_answers_only_its_own_pages(host):
    """Found in review: page ids were p0, p1, ... with no Host check and no body cap, so any local process (or a page
    rebinding a name to 127.0.0.1) could drive a running episode's phone."""
    import socket

    import httpx

    env = GuiEnv(renderer="browser", shared=host, screenshots=False)
    env.reset(seed=0)
    try:
        [page_id] = [p for p, phone in host.phones.items() if phone is env.phone]
        port = host._server.server_address[1]
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/screen/{page_id}").status_code == 200  # the page Chromium loads
        assert httpx.get(f"{base}/screen/{page_id.split('-')[0]}").status_code == 404  # a counted id is no id
        rebound = httpx.get(f"{base}/screen/{page_id}", headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 404
        before = env.phone.version
        event = {"type": "tap", "key": "home:clock"}
        assert httpx.post(f"{base}/event/{page_id}", json=event, headers={"Host": "evil:1"}).status_code == 404
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # a body it must not wait for
            sock.sendall(f"POST /event/{page_id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                         f"Content-Length: {10**9}\r\n\r\n{{}}".encode())
            assert sock.recv(64).startswith(b"HTTP/1.0 413")
        assert env.phone.version == before
    finally:
        env.close()
