"""Human web mode in headless Chromium: search, open the item, pick the options, buy, read the score."""

import os
import re

import pytest

from agentrl.envs.webshop import WebShopEnv
from agentrl.envs.webshop.server import start_server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"needs {CHROMIUM} (apt-get install chromium)"),
]


def test_buy_the_goal_product_in_the_browser(tmp_path):
    playwright_api = pytest.importorskip("playwright.sync_api")
    kwargs = {"num_products": 200, "seed": 11, "cache_dir": str(tmp_path)}
    env = WebShopEnv(**kwargs)
    env.reset(seed=4)
    goal = env.goal
    product = env.resource.products[goal["product_index"]]
    with start_server(**kwargs) as server, playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{server.url}/?seed=4")
            assert goal["instruction_text"] in page.content().replace("&#x27;", "'")
            page.fill("#search_input", goal["name"])
            page.click("button.search")
            page.get_by_role("button", name=product["asin"], exact=True).click()
            page.wait_for_selector(f"text=Price: {product['Price']}")
            for name, value in goal["goal_options"].items():
                exact = re.compile(f"^{re.escape(value)}$")
                page.locator(f'button.option[data-option="{name}"]').filter(has_text=exact).click()
                page.wait_for_selector(f'button.option.selected[data-option="{name}"]')
                assert page.locator(f'button.option.selected[data-option="{name}"]').inner_text() == value
            page.get_by_role("button", name="Buy Now").click()
            page.wait_for_selector("text=Thank you for shopping with us!")
            text = page.inner_text("body")
            assert "Your score (min 0.0, max 1.0)" in text
            assert text.strip().endswith("Your score (min 0.0, max 1.0)\n\n1.0")  # the debug block stays hidden
        finally:
            browser.close()
