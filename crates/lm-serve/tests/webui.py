"""The chat page in headless Chromium, driven by selenium (tests/webui.rs runs it).

Usage: webui.py BASE_URL API_KEY ARTIFACTS_DIR CHROMIUM CHROMEDRIVER

Against a server on SmolLM2 started with API_KEY: the page asks for the key;
a message typed at temperature 0 streams a reply equal to the API's answer
to the same request; hovering a token shows the API's top alternatives with
their probabilities; the distribution chart is the softmax of the top
log-probabilities at the slider's temperature; Stop ends a reply mid-stream;
Regenerate replaces it. Screenshots at desktop and phone width go to
ARTIFACTS_DIR. Prints "all checks passed" at the end.
"""

import json
import math
import os
import sys
import time
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

BASE, KEY, OUT, CHROMIUM, CHROMEDRIVER = sys.argv[1:6]
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
    check(request["temperature"] == 0 and request["stream"] is True and request["top_logprobs"] == 10,
          f"the page asked for a greedy stream with 10 alternatives: {request}")
    return message, page_text, api(request)


def softmax_top(logprobs, t):
    top = max(l / t for l in logprobs)
    w = [math.exp(l / t - top) for l in logprobs]
    return [x / sum(w) for x in w]


def check_tokens(d, message, choice):
    entries = choice["logprobs"]["content"]
    spans = message.find_elements(By.CSS_SELECTOR, ".tok")
    check(len(spans) == len(entries), f"one span per token: {len(spans)} vs {len(entries)}")
    check("".join(s.get_attribute("textContent") for s in spans) == choice["message"]["content"],
          "the spans spell the reply")
    ActionChains(d).move_to_element(spans[1]).perform()
    tip = d.find_element(By.ID, "tip")
    WebDriverWait(d, 5).until(lambda d: tip.is_displayed())
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in tip.find_elements(By.TAG_NAME, "tr")]
    alternatives = entries[1]["top_logprobs"]
    check(len(rows) == len(alternatives) == 10, f"10 alternatives in the tooltip: {rows}")
    for row, alt in zip(rows, alternatives):
        check(row[1].strip() == show(alt["token"]).strip(), f"alternative {row} is the API's {alt}")
        p = float(row[2].rstrip("%")) / 100
        check(abs(p - math.exp(alt["logprob"])) < 0.0051 * max(p, 0.01) + 1e-4,
              f"probability {row[2]} is exp({alt['logprob']})")
    chosen = tip.find_element(By.CSS_SELECTOR, "tr.chosen td").text
    check(chosen == "1", "greedy: the chosen token has rank 1")
    check("rank 1" in tip.find_element(By.CLASS_NAME, "head").text, "the head says rank 1")

    # The chart: that step's top candidates re-softmaxed at the slider's T.
    spans[1].click()
    d.find_element(By.ID, "show-dist").click()
    logprobs = [a["logprob"] for a in alternatives]
    for t in ["1", "0.5", "2.5"]:
        d.execute_script("const s = document.getElementById('dist-t'); s.value = arguments[0];"
                         "s.dispatchEvent(new Event('input'));", t)
        bars = [float(b.get_attribute("data-p")) for b in d.find_elements(By.CSS_SELECTOR, "#bars .bar")]
        want = softmax_top(logprobs, float(t))
        check(len(bars) == 10 and all(abs(a - b) < 1e-9 for a, b in zip(bars, want)),
              f"bars at T = {t} are the renormalised softmax: {bars} vs {want}")
    d.find_element(By.ID, "show-table").click()
    rows = d.find_elements(By.CSS_SELECTOR, "#rows tr")
    check(len(rows) == len(entries), f"the table has a row per step: {len(rows)}")


def main():
    os.makedirs(OUT, exist_ok=True)
    started = time.monotonic()
    d = browser()
    try:
        d.get(BASE + "/")
        WebDriverWait(d, WAIT).until(lambda d: d.find_element(By.ID, "keybox").is_displayed())
        check(True, "the page asks for the API key")
        d.find_element(By.ID, "key").send_keys(KEY)
        d.find_element(By.ID, "save-key").click()
        WebDriverWait(d, WAIT).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")
        check(not d.find_element(By.ID, "keybox").is_displayed(), "the key was accepted")

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
    finally:
        d.quit()
    print(f"all checks passed in {time.monotonic() - started:.1f} s")


main()
