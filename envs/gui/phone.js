// Input events of the mocked phone page go back to the Python state machine (POST /event/<page>).
// The page never changes itself: after each gesture Python calls window.__sync(), which swaps in the new screen
// when the phone's state moved. window.__seen counts handled events so Python can wait for a wheel event to arrive.
(() => {
  const page = document.body.dataset.page;
  let queue = Promise.resolve();
  let pressedAt = 0;
  window.__seen = 0;
  const post = (event) => {
    window.__seen += 1;
    queue = queue
      .then(() => fetch(`/event/${page}`, { method: "POST", body: JSON.stringify(event) }))
      .catch(() => {});
  };
  document.addEventListener("pointerdown", () => { pressedAt = performance.now(); }, true);
  document.addEventListener("click", (e) => {
    const el = e.target.closest("[data-key]");
    if (!el) return;
    // Held for 500 ms or more: Android's long-press timeout.
    const long = performance.now() - pressedAt >= 500;
    post({ type: long ? "long_press" : "tap", key: el.dataset.key });
  }, true);
  document.addEventListener("input", (e) => {
    if (e.target.dataset && e.target.dataset.key) post({ type: "set", key: e.target.dataset.key, value: e.target.value });
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Enter") post({ type: "enter" }); });
  document.addEventListener("wheel", (e) => {
    e.preventDefault();
    const direction = Math.abs(e.deltaY) >= Math.abs(e.deltaX)
      ? (e.deltaY > 0 ? "down" : "up") : (e.deltaX > 0 ? "right" : "left");
    post({ type: "scroll", x: Math.round(e.clientX), y: Math.round(e.clientY), direction });
  }, { passive: false });
  const focusField = () => {
    const field = document.querySelector("input[autofocus]");
    if (field) { field.focus(); field.setSelectionRange(field.value.length, field.value.length); }
  };
  // Wait for this page's events to reach the phone, then swap in the new screen if the phone's state moved
  // (cheaper than a navigation). Returns the version of the state now shown.
  window.__sync = async (shown) => {
    await queue;
    const response = await fetch(`/body/${page}?since=${shown}`);
    if (response.status === 204) return shown;
    const version = Number(response.headers.get("X-Version"));
    document.body.innerHTML = await response.text();
    focusField();
    return version;
  };
  focusField();
})();
