"""Open an HTML file in headless Chromium (Debian's ``chromium``) and report what a person
would see: console errors, uncaught exceptions, failed or remote resource loads, how many
bokeh documents and canvases rendered, and a screenshot.

Chromium's own headless mode is used (no driver): a probe script is injected at the top of
a copy of the page; it records errors and, after the page settled, writes a JSON summary
into the DOM, which ``--dump-dom`` prints. ``--host-resolver-rules`` makes every host name
unresolvable, so a page that needed the network would show it as failed loads.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--hide-scrollbars",
                  "--host-resolver-rules=MAP * ~NOTFOUND"]

PROBE = """<script>
window.__probe = {errors: [], failed: []};
addEventListener('error', e => {
  const t = e.target;
  if (t && t !== window && (t.src || t.href)) __probe.failed.push(t.src || t.href);
  else __probe.errors.push('uncaught: ' + (e.message || e));
}, true);
addEventListener('unhandledrejection', e => __probe.errors.push('rejection: ' + e.reason));
for (const level of ['error', 'warn']) {
  const orig = console[level].bind(console);
  console[level] = (...a) => { __probe.errors.push('console.' + level + ': ' + a.join(' '));
                               orig(...a); };
}
function __canvases(root) {
  let n = 0;
  for (const el of root.querySelectorAll('*')) {
    if (el.tagName === 'CANVAS' && el.width > 0 && el.height > 0) n++;
    if (el.shadowRoot) n += __canvases(el.shadowRoot);
  }
  return n;
}
addEventListener('load', () => setTimeout(() => {
  const pre = document.createElement('pre');
  pre.id = '__probe';
  pre.textContent = JSON.stringify({
    errors: __probe.errors, failed: __probe.failed,
    resources: performance.getEntriesByType('resource').map(r => r.name),
    documents: window.Bokeh ? Bokeh.documents.length : 0,
    roots: window.Bokeh && Bokeh.documents.length ? Bokeh.documents[0].roots().length : 0,
    canvases: __canvases(document)});
  document.body.appendChild(pre);
}, 2500));
</script>"""


def chromium() -> str | None:
    """Path of Debian's Chromium, or None."""
    return shutil.which("chromium") or (
        "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def probe(html_file: Path, screenshot: Path, size: tuple[int, int] = (1400, 1800),
          timeout: float = 90) -> dict:
    """Load ``html_file`` in headless Chromium; returns the probe's JSON summary and
    writes ``screenshot`` (PNG) of the original page."""
    exe = chromium()
    assert exe, "chromium not found"
    page = html_file.read_text()
    probed = html_file.with_name(html_file.stem + "-probe.html")
    probed.write_text(re.sub(r"<head>", "<head>" + PROBE, page, count=1))
    budget = "--virtual-time-budget=20000"
    dom = subprocess.run([exe, *CHROMIUM_FLAGS, budget, "--dump-dom", probed.as_uri()],
                         capture_output=True, text=True, timeout=timeout)
    m = re.search(r'<pre id="__probe">(.*?)</pre>', dom.stdout, re.S)
    assert m, f"probe did not report; chromium said: {dom.stderr[-2000:]}"
    import html as _html

    out = json.loads(_html.unescape(m.group(1)))
    subprocess.run([exe, *CHROMIUM_FLAGS, budget, f"--window-size={size[0]},{size[1]}",
                    f"--screenshot={screenshot}", html_file.as_uri()],
                   capture_output=True, text=True, timeout=timeout)
    return out
