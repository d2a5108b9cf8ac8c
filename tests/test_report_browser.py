"""The report in a real browser: Debian's chromium driven by Playwright.

A small real PyTorch run (with an annotation named like an XSS attack) and a
large synthetic run (1.2 M spans, written through the core): no console
errors, every section drawn, the timeline draws, zooms (redraw time measured
in the page), shows details on click and zooms to a step.

tests/setup_browser.sh installs chromium (tox runs it first). Where it cannot
be had the tests skip, unless CI=true or STEPSCOPE_REQUIRE_BROWSER=1, where they fail.
"""

import io
import os
import subprocess
import sys

import pytest

import stepscope

from conftest import run_python

CHROMIUM = os.environ.get("STEPSCOPE_CHROMIUM", "/usr/bin/chromium")
XSS = "<img src=x onerror=alert(1)>"
SECTIONS = ("verdict", "summary", "steps", "system", "timeline", "metadata")


def _unavailable():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing (tests/setup_browser.sh installs Debian's chromium)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _unavailable()
    if reason:
        if os.environ.get("STEPSCOPE_REQUIRE_BROWSER") == "1" or os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class Page:
    """A report opened in a fresh page, recording console errors and dialogs."""

    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1300, "height": 900})
        self.errors, self.dialogs = [], []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(f"file://{path}", timeout=60_000)
        self.page.wait_for_function("window.stepscopeTimeline && window.stepscopeTimeline.ready")

    def js(self, code):
        return self.page.evaluate(code)


def _ink(png: bytes) -> float:
    """Share of pixels that are not the page's white background."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("L")
    hist = img.histogram()
    return 1 - sum(hist[245:]) / sum(hist)


def _report(run_path, out, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-m", "stepscope", "report", str(run_path), "-o", str(out)], cwd=cwd,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


TRAIN = f"""
import time, torch, stepscope
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
ds = TensorDataset(torch.randn(480, 32), torch.randn(480, 1))
loader = DataLoader(ds, batch_size=32, num_workers=1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(2):
    for xb, yb in loader:
        opt.zero_grad()
        with stepscope.annotate({XSS!r}):
            time.sleep(0.002)
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
print("trained")
"""


@pytest.fixture(scope="module")
def small_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small")
    (tmp / "train.py").write_text(TRAIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE")}
    r = subprocess.run([sys.executable, "-m", "stepscope", "run", "--dir", "runs", "--name", "small",
                        "--interval-ms", "50", "--", sys.executable, "train.py"], cwd=tmp, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "trained" in r.stdout, r.stderr[-3000:]
    run = stepscope.load(tmp / "runs" / "small", quiet=True)
    return _report(run.path, tmp / "small.html", tmp), run


def test_small_run_every_section_and_the_timeline(browser, small_report):
    path, run = small_report
    p = Page(browser, path)
    page = p.page
    assert run.steps["mode"].astype(str).tolist().count("train") == 30
    # every section drawn: plots render when scrolled near; each section has ink
    page.evaluate("window.stepscopeDrawPlots()")
    n_plots = page.locator("div.plot").count()
    assert n_plots >= 5
    page.wait_for_function(f"document.querySelectorAll('div.plot .main-svg').length >= {n_plots}")
    for section in SECTIONS:
        loc = page.locator(f"#{section}")
        assert _ink(loc.screenshot()) > 0.01, section
    # the timeline: drawn, its tree has the process, a thread and the steps
    tl = page.locator("#tl-canvas")
    tl.scroll_into_view_if_needed()
    assert _ink(tl.screenshot()) > 0.1
    assert p.js("window.stepscopeTimeline.draws") >= 1
    # zoom with the wheel, then with W; pan with D (redraw timed in the page)
    v = p.js("window.stepscopeTimeline.view()")
    box = tl.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 40)
    page.mouse.wheel(0, -400)
    page.wait_for_function(f"window.stepscopeTimeline.view()[1] - window.stepscopeTimeline.view()[0] < {0.8 * (v[1] - v[0])}")
    w1 = p.js("window.stepscopeTimeline.view()")
    page.keyboard.press("w")
    page.wait_for_function(f"window.stepscopeTimeline.view()[1] - window.stepscopeTimeline.view()[0] < {0.9 * (w1[1] - w1[0])}")
    w2 = p.js("window.stepscopeTimeline.view()")
    page.keyboard.press("d")
    page.wait_for_function(f"window.stepscopeTimeline.view()[0] > {w2[0]}")
    assert p.js("window.stepscopeTimeline.zoom(0.5)") < 100  # ms, measured with performance.now()
    # zoom to step 7 (train): the view is that step's span, padded 5% each side
    page.fill("#tl-step", "7")
    page.click("#tl-step-go")
    t7 = run.steps[(run.steps["mode"] == "train") & (run.steps["step"] == 7)].iloc[0]
    base = int(p.js("JSON.parse(document.getElementById('tl-data').textContent).meta.base_epoch_ns"))
    a, b = p.js("window.stepscopeTimeline.view()")
    width = t7.end_ns - t7.start_ns
    assert abs(a - (t7.start_ns - base - 0.05 * width)) < 1e3 and abs(b - (t7.end_ns - base + 0.05 * width)) < 1e3
    # click the annotation: details, as text; no dialog, no <img> element
    i = p.js(f"window.stepscopeTimeline.findItem({XSS!r})")
    assert i >= 0
    x, y = p.js(f"window.stepscopeTimeline.pointOf({i})")
    tl.click(position={"x": x, "y": y})
    details = page.locator("#tl-details")
    details.wait_for()
    text = details.inner_text()
    assert XSS in text and "annotation" in text and "train 7" in text, text
    assert p.js("document.querySelectorAll('img').length") == 0
    assert XSS not in page.content().split("tl-details")[0]  # only escaped in the markup before
    # fold the process in the tree: fewer rows, canvas shorter
    h = p.js("document.getElementById('tl-canvas').height")
    tl.click(position={"x": 30, "y": 22 + 18 + 9})  # the process header, under the host's
    page.wait_for_function(f"document.getElementById('tl-canvas').height < {h}")
    assert p.errors == [] and p.dialogs == []


def _large_run(path, spans):
    """Step marks and five phases per step, written through the core (as bench/analysis_load.py)."""
    r = run_python(f"""
        import numpy as np, stepscope
        from stepscope.core import _native
        run = stepscope.start(dir={str(path)!r}, name="big", buffer_mb=256, interval_ms=100)
        tpn = _native.clock_info()["ticks_per_ns"]
        phase = stepscope.CATEGORIES.index("phase")
        ids = [_native.intern(p) for p in ("GetNext", "Forward", "Loss", "Backward", "Optimizer")]
        durs = (np.random.default_rng(0).integers(20_000, 200_000, size=({spans} // 5, 5)) * tpn).astype(np.int64).tolist()
        t = _native.now()
        for d5 in durs:
            _native.begin_step("train", t)
            for pid, d in zip(ids, d5):
                _native.span(phase, pid, t, t + d)
                t += d + int(1000 * tpn)
        run.stop()
        print(run.stats["dropped"])
    """, cwd=path, timeout=300)
    assert r.returncode == 0 and r.stdout.split()[-1] == "0", r.stderr
    return path / "big"


def test_large_run_opens_and_zooms_quickly(browser, tmp_path):
    run_path = _large_run(tmp_path, 1_200_000)
    out = _report(run_path, tmp_path / "big.html", tmp_path)
    p = Page(browser, out)
    assert p.page.locator("#tl-capped").count() == 1  # merged detail, and it says so
    items = p.js("window.stepscopeTimeline.items")
    assert 100_000 < items <= 1_000_000
    draws = [p.js("window.stepscopeTimeline.setView(0, 1e18)")]
    for _ in range(30):
        draws.append(p.js("window.stepscopeTimeline.zoom(0.5)"))
    assert max(draws) < 100, draws  # ms per redraw, from the whole run to microseconds
    assert p.js("window.stepscopeTimeline.zoomToStep(100000)")
    assert _ink(p.page.locator("#tl-canvas").screenshot()) > 0.1
    assert p.errors == [] and p.dialogs == []
