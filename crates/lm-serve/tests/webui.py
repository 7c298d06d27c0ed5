"""The chat page in headless Chromium, driven by selenium (tests/webui.rs runs it).

Usage: webui.py BASE_URL API_KEY ARTIFACTS_DIR CHROMIUM CHROMEDRIVER

Against a server on SmolLM2 started with API_KEY: the page asks for the key;
a message typed at temperature 0 streams a reply equal to the API's answer
to the same request; hovering a token shows the API's top alternatives with
their probabilities before and after the sampling stages; the distribution
chart is the softmax of the top raw logits (`lm_trace`) at the slider's
temperature; Stop ends a reply mid-stream; Regenerate replaces it; a
sampled, seeded reply equals the API's and a token's tooltip shows the API's
draw u and its before/after probabilities; the Content-Security-Policy
(hashes, no 'unsafe-inline') lets the page's script and style run and
blocks nothing. Screenshots at desktop and phone width go to ARTIFACTS_DIR.
Prints "all checks passed" at the end.
"""

import json
import math
import os
import re
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

BASE, KEY, OUT, CHROMIUM, CHROMEDRIVER = sys.argv[1:6]
# "models": a server of several models (SmolLM2's q4 and q8) instead of one.
MODE = sys.argv[6] if len(sys.argv) > 6 else "one"
WAIT = 60


def check(ok, what):
    if not ok:
        raise AssertionError(what)
    print("ok:", what.split("\n")[0][:120], flush=True)


def show(token):
    """A token as the page writes it (JSON.stringify without the quotes)."""
    return json.dumps(token, ensure_ascii=False)[1:-1]


def api(body):
    """The same request through the API, whole (not streamed)."""
    body = dict(body, stream=False)
    body.pop("stream_options", None)
    request = urllib.request.Request(
        BASE + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY},
    )
    with urllib.request.urlopen(request, timeout=WAIT) as answer:
        return json.load(answer)["choices"][0]


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,860", "--hide-scrollbars", "--force-device-scale-factor=1"]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def set_field(d, field_id, value):
    field = d.find_element(By.ID, field_id)
    field.clear()
    if value != "":
        field.send_keys(str(value))


def wait_idle(d):
    """Until the page has finished a reply; returns the last assistant message."""
    WebDriverWait(d, WAIT).until(
        lambda d: d.execute_script("return document.body.dataset.busy") == ""
        and d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-finish]"))
    return d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]


def send(d, text):
    box = d.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def greedy_reply(d):
    """The last reply and the API's answer to the same request."""
    message = wait_idle(d)
    page_text = message.get_attribute("data-content")
    request = d.execute_script("return window.lmChat.state.lastRequest")
    check(request["temperature"] == 0 and request["stream"] is True and request["top_logprobs"] == 10
          and request["lm_trace"] is True,
          f"the page asked for a greedy stream with 10 alternatives and the trace: {request}")
    return message, page_text, api(request)


def softmax_top(logits, t):
    top = max(z / t for z in logits)
    w = [math.exp(z / t - top) for z in logits]
    return [x / sum(w) for x in w]


def close(a, b):
    """Two probabilities the page and Python computed from the same numbers."""
    return abs(a - b) <= 1e-12 * max(abs(b), 1e-300)


def check_one_logprob(choice):
    """Issue 42: the chosen token's logprob is its top_logprobs entry, exactly."""
    for i, entry in enumerate(choice["logprobs"]["content"]):
        for alt in entry["top_logprobs"]:
            if alt["token"] == entry["token"]:
                check(alt["logprob"] == entry["logprob"], f"step {i}: one log-probability {alt} {entry['logprob']}")
        trace = choice["lm_trace"][i]
        chosen = [c for c in trace["model_top"] if c["id"] == trace["id"]]
        check(not chosen or chosen[0]["logprob"] == entry["logprob"], f"step {i}: the trace's is the same")


def hover(d, span):
    """The tooltip of `span`: (head text, data-* of the tooltip, rows)."""
    ActionChains(d).move_to_element(span).perform()
    tip = d.find_element(By.ID, "tip")
    WebDriverWait(d, 5).until(lambda d: tip.is_displayed())
    rows = [([td.text for td in tr.find_elements(By.TAG_NAME, "td")],
             tr.get_attribute("data-before"), tr.get_attribute("data-after"))
            for tr in tip.find_elements(By.CSS_SELECTOR, "tbody tr")]
    head = tip.find_element(By.CLASS_NAME, "head").text
    data = {k: tip.get_attribute("data-" + k) for k in ["u", "before", "after"]}
    return head, data, rows


def check_step_view(d, span, choice, i):
    """The tooltip of step i shows the API's trace: before, after, u, rank."""
    trace = choice["lm_trace"][i]
    head, data, rows = hover(d, span)
    after = {c["id"]: math.exp(c["logprob"]) for c in trace["policy_top"]}
    survivors = trace["n_candidates"][-1]["n"]
    check(len(rows) == len(trace["model_top"]) == 10, f"10 alternatives in the tooltip: {rows}")
    bad = []
    for (cells, before_p, after_p), c in zip(rows, trace["model_top"]):
        p = float(cells[2].rstrip("%")) / 100
        want_after = after.get(c["id"], 0.0 if survivors <= len(trace["policy_top"]) else None)
        if (cells[1].strip() != show(c["token"]).strip()
                or not close(float(before_p), math.exp(c["logprob"]))
                or abs(p - math.exp(c["logprob"])) >= 0.0051 * max(p, 0.01) + 1e-4
                or not ((after_p == "" and want_after is None) or close(float(after_p), want_after))):
            bad.append((cells, before_p, after_p, c, want_after))
    check(not bad, f"step {i}: each row is the API's token, p before (model_top) and after (policy_top): {bad}")
    check(close(float(data["before"]), math.exp(trace["logprob"])), f"the chosen token's before {data}")
    check(close(float(data["after"]), math.exp(trace["policy_logprob"])), f"the chosen token's after {data}")
    if trace["u"] is None:
        check(data["u"] == "" and "greedy: no draw" in head, f"greedy: no u ({head!r})")
    else:
        check(float(data["u"]) == trace["u"] and f"u = {trace['u']:.6f}" in head,
              f"the draw u = {trace['u']} in {head!r}")
    ids = [c["id"] for c in trace["model_top"]]
    chosen = [tr.text for tr in d.find_elements(By.CSS_SELECTOR, "#tip tr.chosen td:first-child")]
    if trace["id"] in ids:
        rank = ids.index(trace["id"]) + 1
        check(f"rank {rank} (" in head and chosen == [str(rank)], f"rank {rank}: {head!r}, row {chosen}")
    else:
        check("rank > 10 (" in head and not chosen, f"rank > 10: {head!r}")
    return trace


def check_tokens(d, message, choice):
    entries = choice["logprobs"]["content"]
    spans = message.find_elements(By.CSS_SELECTOR, ".tok")
    check(len(spans) == len(entries), f"one span per token: {len(spans)} vs {len(entries)}")
    check("".join(s.get_attribute("textContent") for s in spans) == choice["message"]["content"],
          "the spans spell the reply")
    check_one_logprob(choice)
    trace = check_step_view(d, spans[1], choice, 1)
    head = d.find_element(By.CSS_SELECTOR, "#tip .head").text
    check("rank 1" in head and "after" in head, f"greedy: rank 1, 100% after: {head!r}")

    # The chart: that step's top candidates' logits re-softmaxed at the slider's T.
    spans[1].click()
    d.find_element(By.ID, "show-dist").click()
    logits = [c["logit"] for c in trace["model_top"]]
    for t in ["1", "0.5", "2.5"]:
        d.execute_script("const s = document.getElementById('dist-t'); s.value = arguments[0];"
                         "s.dispatchEvent(new Event('input'));", t)
        bars = [float(b.get_attribute("data-p")) for b in d.find_elements(By.CSS_SELECTOR, "#bars .bar")]
        want = softmax_top(logits, float(t))
        check(len(bars) == 10 and all(abs(a - b) < 1e-9 for a, b in zip(bars, want)),
              f"bars at T = {t} are the renormalised softmax of the logits: {bars} vs {want}")
    d.find_element(By.ID, "show-table").click()
    rows = d.find_elements(By.CSS_SELECTOR, "#rows tr")
    check(len(rows) == len(entries), f"the table has a row per step: {len(rows)}")
    cells = [td.text for td in rows[1].find_elements(By.TAG_NAME, "td")]
    check(len(cells) == 8 and cells[3] == "100.0%" and cells[4] == "" and cells[6].startswith("vocabulary "),
          f"the table's columns: p after, u, the stage counts: {cells}")


def check_sampled(d):
    """A seeded sampled reply: the API's, and its tooltips show the API's draws."""
    set_field(d, "temperature", 0.9)
    set_field(d, "top_k", 40)
    set_field(d, "seed", 7)
    send(d, "Name three colours.")
    message = wait_idle(d)
    request = d.execute_script("return window.lmChat.state.lastRequest")
    choice = api(request)
    page_text = message.get_attribute("data-content")
    check(request["seed"] == 7 and page_text == choice["message"]["content"],
          f"the seeded sampled reply equals the API's: {page_text!r}")
    check_one_logprob(choice)
    spans = message.find_elements(By.CSS_SELECTOR, ".tok")
    for i in range(min(4, len(spans))):
        trace = check_step_view(d, spans[i], choice, i)
        check({"stage": "top_k", "n": 40} in trace["n_candidates"] and trace["n_candidates"][-1]["n"] <= 40,
              f"top-k left 40: {trace['n_candidates']}")
    stages = d.find_element(By.CSS_SELECTOR, "#tip .stages").text
    check("top_k 40" in stages, f"the stage counts in the tooltip: {stages!r}")
    d.execute_script("document.getElementById('tip').style.display = 'none'")


def check_policy(d):
    """The page's script and style ran under its CSP, which blocked nothing."""
    background = d.execute_script("return getComputedStyle(document.querySelector('header')).backgroundColor")
    check(background == "rgb(29, 35, 48)", f"the inline style applies: {background}")
    blocked = [e["message"] for e in d.get_log("browser") if "Content Security Policy" in e["message"]]
    check(not blocked, f"no CSP violation: {blocked}")


def open_page(d):
    """Loads the page and gives it the API key it asks for."""
    d.get(BASE + "/")
    WebDriverWait(d, WAIT).until(lambda d: d.find_element(By.ID, "keybox").is_displayed())
    check(True, "the page asks for the API key")
    d.find_element(By.ID, "key").send_keys(KEY)
    d.find_element(By.ID, "save-key").click()
    WebDriverWait(d, WAIT).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
    check(not d.find_element(By.ID, "keybox").is_displayed(), "the key was accepted")
    check_policy(d)


def requests_by_model():
    """`lm_requests_total` of each model, from /metrics."""
    request = urllib.request.Request(BASE + "/metrics", headers={"Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(request, timeout=WAIT) as answer:
        text = answer.read().decode()
    samples = re.findall(r'^lm_requests_total\{model="([^"]+)"\} (\d+)$', text, re.M)
    return {model: int(n) for model, n in samples}


def main_models():
    """Several models: the page lists them and the picked one answers."""
    d = browser()
    try:
        open_page(d)
        select = d.find_element(By.ID, "models")
        ids = [o.get_attribute("value") for o in select.find_elements(By.TAG_NAME, "option")]
        check(select.is_displayed() and ids == ["q4", "q8"], f"the page lists both models: {ids}")
        set_field(d, "temperature", 0)
        set_field(d, "max_tokens", 12)
        for model in ["q8", "q4"]:
            Select(select).select_by_value(model)
            header = d.find_element(By.ID, "model").text
            check(header == "context 8192", f"the header shows {model}'s context: {header!r}")
            before = requests_by_model()
            send(d, "Name a colour.")
            message = wait_idle(d)
            after = requests_by_model()
            served = {m: after[m] - before.get(m, 0) for m in after}
            check(served == {"q4": int(model == "q4"), "q8": int(model == "q8")},
                  f"the page's request went to {model}: {served}")
            _, page_text, choice = greedy_reply(d)
            check(page_text == choice["message"]["content"],
                  f"{model}'s reply is its API answer: {page_text!r}")
    finally:
        d.quit()
    print("all checks passed")


def main():
    if MODE == "models":
        return main_models()
    os.makedirs(OUT, exist_ok=True)
    started = time.monotonic()
    d = browser()
    try:
        open_page(d)

        set_field(d, "temperature", 0)
        set_field(d, "max_tokens", 24)
        send(d, "What is the capital of France?")
        message, page_text, choice = greedy_reply(d)
        check(page_text and page_text == choice["message"]["content"],
              f"streamed reply equals the API's greedy answer: {page_text!r} vs {choice['message']['content']!r}")
        timing = d.execute_script("return window.lmChat.state.timing")
        lag = timing["firstToken"] - timing["firstByte"]
        check(0 <= lag < 50, f"first token shown {lag:.1f} ms after the first streamed byte")
        check_tokens(d, message, choice)
        d.execute_script("document.getElementById('tip').style.display = 'none'")

        # Stop a long reply mid-stream.
        set_field(d, "max_tokens", 400)
        send(d, "Write a long story about a dragon and a knight.")
        WebDriverWait(d, WAIT).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
                                     and len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]
                                             .find_elements(By.CSS_SELECTOR, ".tok")) >= 3)
        d.find_element(By.ID, "stop").click()
        stopped = wait_idle(d)
        n_stopped = len(stopped.find_elements(By.CSS_SELECTOR, ".tok"))
        check(stopped.get_attribute("data-finish") == "cancelled" and 3 <= n_stopped < 400,
              f"Stop ended the reply after {n_stopped} tokens")

        # Regenerate: the stopped reply is replaced by the greedy answer.
        set_field(d, "max_tokens", 24)
        d.find_element(By.ID, "regen").click()
        time.sleep(0.2)
        message, page_text, choice = greedy_reply(d)
        check(page_text == choice["message"]["content"] and len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2,
              f"Regenerate replaced the stopped reply with the greedy answer {page_text!r}")

        conversation = d.execute_script("return window.lmChat.conversationJson()")
        check([m["role"] for m in conversation["messages"]] == ["user", "assistant", "user", "assistant"]
              and conversation["messages"][3]["content"] == page_text
              and [r["text"] for r in conversation["replies"]][1] == page_text
              and set(conversation) == {"model", "settings", "messages", "replies"},
              f"the conversation JSON: {json.dumps(conversation)[:200]}")

        check_sampled(d)
        check_policy(d)

        # Screenshots: desktop with a token's alternatives and the chart, then phone.
        token = d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].find_elements(By.CSS_SELECTOR, ".tok")[3]
        d.execute_script("const s = document.getElementById('dist-t'); s.value = 1; s.dispatchEvent(new Event('input'));")
        token.click()
        d.save_screenshot(os.path.join(OUT, "webui-desktop.png"))
        d.find_element(By.TAG_NAME, "header").click()
        d.set_window_size(390, 844)
        WebDriverWait(d, 5).until(lambda d: not d.find_element(By.ID, "settings").is_displayed())
        check(True, "at phone width the settings are collapsed")
        d.find_element(By.ID, "toggle-settings").click()
        check(d.find_element(By.ID, "settings").is_displayed(), "the Settings button opens them")
        d.find_element(By.ID, "toggle-settings").click()
        d.save_screenshot(os.path.join(OUT, "webui-phone.png"))
        width = d.execute_script("return document.documentElement.scrollWidth")
        check(width <= 390, f"nothing wider than the phone: {width}px")
        d.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].find_elements(By.CSS_SELECTOR, ".tok")[3].click()
        left, right, screen = d.execute_script(
            "const b = document.getElementById('tip').getBoundingClientRect(); return [b.left, b.right, innerWidth]")
        check(d.find_element(By.ID, "tip").is_displayed() and 0 <= left and right <= screen,
              f"a tapped token's tooltip fits the phone: {left}..{right} of {screen}px")
    finally:
        d.quit()
    print(f"all checks passed in {time.monotonic() - started:.1f} s")


main()
