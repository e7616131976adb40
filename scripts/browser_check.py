"""Open every page of the built book in headless Chromium and check it as a reader would see it.

    .venv/bin/python scripts/browser_check.py [_build/html]     # prints one line per page, exits 1 on a problem

Per page of the table of contents, at 1280 px wide: it loads without console errors of ours (messages about
remote http(s) resources are ignored: the book is read offline); every internal link and image resolves, and every image has an alt text (not its file name);
every figure in a chapter's output is followed by a caption ("Figure N.k."); math is rendered by MathJax (no
raw TeX delimiters left); no table, display equation or printed output is wider than the content column; no struck-through or
unclosed markup (an `<s>`, `<del>` or `<strike>` element, or text drawn with line-through, in the article or its
contents sidebar); no table cell cut short with '...' (a DataFrame shown without `plots.Table`); no leftover object repr (``<... at 0x...>``) or raw numpy repr (``np.float64(``) in the text;
no word written twice in the prose ("Lemma Lemma"); no figure whose text overlaps (the warning that
`sinklib.plots.overlap` prints under a figure it measured with overlapping labels, ``OVERLAP_MARK``). A screenshot of
every page (1280 px and a 390 px phone width) goes to ``_build/screenshots/``; at the phone width the page
itself must not scroll sideways. Chromium is Debian's package
(``/usr/bin/chromium``), driven by Playwright without downloading a browser.
"""
from __future__ import annotations

import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]

PAGE_JS = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  const col = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const cs = getComputedStyle(col);
  const colW = col.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);  // the content box
  const wide = [];
  for (const t of col.querySelectorAll('table')) {
    const w = Math.max(t.scrollWidth, t.getBoundingClientRect().width);
    if (w > colW + 2) wide.push('table ' + Math.round(w) + ' px: ' + t.innerText.slice(0, 60).replace(/\s+/g, ' '));
  }
  for (const p of col.querySelectorAll('div.cell_output pre, div.output pre')) {  // printed output, if shown
    if (p.offsetParent !== null && p.scrollWidth > p.clientWidth + 2)
      wide.push('printed output ' + p.scrollWidth + ' px: ' + p.innerText.slice(0, 60).replace(/\s+/g, ' '));
  }
  for (const m of col.querySelectorAll('mjx-container[display="true"]')) {
    const box = m.closest('div.math') || m.parentElement;
    const w = m.scrollWidth;
    if (w > colW + 2 || m.scrollWidth > m.clientWidth + 2) wide.push('equation ' + Math.round(w) + ' px');
  }
  const text = col.innerText;
  const rawMath = [];
  for (const pat of ['\\(', '\\[', '$$']) { if (text.includes(pat)) rawMath.push(pat); }
  const uncaptioned = [];
  const cells = [...col.querySelectorAll('div.cell')];
  cells.forEach((c, i) => {
    if (!c.querySelector('.cell_output img')) return;
    let next = c.nextElementSibling;
    while (next && next.matches('script, style')) next = next.nextElementSibling;
    const t = next ? next.innerText.trim() : '';
    if (!/^Figure\s+[\w.]+/.test(t)) uncaptioned.push('cell ' + i + ' followed by: ' + t.slice(0, 60));
  });
  for (const f of col.querySelectorAll('figure')) {
    if (!f.querySelector('figcaption')) uncaptioned.push('figure without figcaption');
  }
  // markup a reader should never see: struck-through text (an unclosed <s> swallows the rest of the page)
  const struck = [...document.querySelectorAll('s, del, strike')].map(e => e.tagName.toLowerCase() + ': ' +
                   e.innerText.slice(0, 40).replace(/\s+/g, ' '));
  for (const e of document.querySelectorAll('article *, .bd-sidebar-secondary *')) {
    if (getComputedStyle(e).textDecorationLine.includes('line-through') && !e.closest('s, del, strike')) {
      struck.push('line-through: ' + e.innerText.slice(0, 40).replace(/\s+/g, ' ')); break;
    }
  }
  // prose, written or generated (captions and sentences in outputs too), not code or printed text: where doubled
  // words are typos ("changes changes" was in a generated table caption)
  const prose = [...col.querySelectorAll('p, li, h1, h2, h3, h4, figcaption, dt, dd, th, caption')]
    .filter(e => !e.closest('pre, code')).map(e => e.innerText).join('\n');
  // a table cell that pandas cut short ('...' at the end: a DataFrame displayed without plots.Table)
  const cut = [...col.querySelectorAll('td, th')].filter(e => /\.\.\.$/.test(e.innerText.trim()))
    .map(e => e.innerText.trim().slice(-50));
  const badImages = [...document.images].filter(im => !(im.complete && im.naturalWidth > 0)).map(im => im.src);
  // an image whose alt text is missing or only its file name (what a screen reader would read out)
  const noAlt = [...col.querySelectorAll('img')].filter(im => !im.alt || /\.(png|jpe?g|svg|gif)$/i.test(im.alt))
    .map(im => im.getAttribute('src').split('/').pop().slice(0, 24));
  const links = [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));
  return {colW, wide, rawMath, uncaptioned, badImages, noAlt, links, struck, text, prose, cut,
          mathCount: col.querySelectorAll('mjx-container').length};
}
"""


#: leftovers of code that a reader should not see in a page's text (outputs included)
LEFTOVERS = (
    (re.compile(r"<[\w.]+(?: [\w.]+)*? (?:object )?at 0x[0-9a-fA-F]+>"), "object repr"),
    (re.compile(r"\bnp\.(?:float|int|uint|bool|str|complex)_?\d*\("), "raw numpy repr"),
    (re.compile(r"'(?:data/results|sinkbook_results|\$SINKBOOK_RESULTS)/[\w.-]+\.json'"), "results path echoed by a cell"),
)
#: the words `sinklib.plots.overlap.OVERLAP_MARK` starts its warning with, under a figure whose drawn texts overlap
#: (measured when the chapter ran; a test checks the two agree)
FIGURE_OVERLAP = re.compile(r"Figure check: overlapping text[^\n]*")
#: a word written twice in prose ("Lemma Lemma 1", "exercise Exercise 20"); case-insensitive, 3+ letters
DOUBLED = re.compile(r"\b([A-Za-z]{3,}) \1\b", re.IGNORECASE)


def text_problems(text: str, prose: str) -> list[str]:
    """Problems visible in a page's text: object and numpy reprs anywhere, doubled words in the prose, the warning
    under a figure with overlapping text."""
    out = []
    for pat, what in LEFTOVERS:
        out += [f"{what} left in the page: {m.group(0)[:60]}" for m in pat.finditer(text)]
    out += [f"doubled word: {m.group(0)!r}" for m in DOUBLED.finditer(prose)]
    out += [f"figure with overlapping text labels: {m.group(0)[:160]}" for m in FIGURE_OVERLAP.finditer(text)]
    return sorted(set(out))


@dataclass
class PageReport:
    page: str
    problems: list[str] = field(default_factory=list)
    math: int = 0
    links: int = 0


def toc_pages(root: Path = ROOT) -> list[str]:
    import yaml

    toc = yaml.safe_load((root / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for e in entries or []:
            if "file" in e:
                pages.append(e["file"])
            walk(e.get("sections"))
            walk(e.get("chapters"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return pages


def chromium() -> str | None:
    for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if c and Path(c).exists():
            return c
    return None


_IDS: dict[Path, set[str]] = {}


#: at a phone width the page itself must not scroll sideways (wide tables and equations scroll inside their own
#: box, book/_static/narrow.css)
PHONE_JS = r"""
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) { await MathJax.startup.promise; }
  return {page: document.documentElement.scrollWidth, view: window.innerWidth};
}
"""


def _ids(path: Path) -> set[str]:
    if path not in _IDS:
        _IDS[path] = set(re.findall(r'\bid="([^"]+)"', path.read_text(errors="replace")))
    return _IDS[path]


def _link_problem(page_file: Path, href: str) -> str | None:
    if re.match(r"^(https?:|mailto:|javascript:|data:)", href) or href.startswith("//"):
        return None
    url = urljoin(page_file.as_uri(), href)
    u = urlparse(url)
    target = Path(unquote(u.path))
    if target.is_dir():
        target = target / "index.html"
    if not target.exists():
        return f"broken link {href}"
    if u.fragment and target.suffix == ".html" and unquote(u.fragment) not in _ids(target):
        return f"broken anchor {href}"
    return None


def check_book(html: Path, shots: Path | None = None, pages: list[str] | None = None) -> list[PageReport]:
    """Open each page; returns one report per page (empty `problems` = the page passed)."""
    from playwright.sync_api import sync_playwright

    exe = chromium()
    if exe is None:
        raise RuntimeError("Chromium is not installed (Debian: apt-get install chromium)")
    shots = shots or html.parent / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    reports = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
        for name in pages or toc_pages():
            rep = PageReport(name)
            f = html / f"{name}.html"
            if not f.exists():
                rep.problems.append("page not built")
                reports.append(rep)
                continue
            page = ctx.new_page()
            errors: list[str] = []
            page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.goto(f.as_uri(), wait_until="load")
            res = page.evaluate(PAGE_JS)
            # not ours: failed remote requests (read offline), and the theme's note on an empty stored colour mode
            ours = [e for e in errors if not re.search(r"https?://|ERR_(INTERNET|NAME|CONNECTION|NETWORK)|"
                                                       r"Got invalid theme mode", e)]
            rep.problems += [f"console error: {e[:200]}" for e in ours]
            rep.problems += [f"too wide for the {res['colW']:.0f} px column: {w}" for w in res["wide"]]
            rep.problems += [f"raw TeX delimiter {m!r} left in the text" for m in res["rawMath"]]
            rep.problems += [f"figure without caption: {u}" for u in res["uncaptioned"]]
            rep.problems += [f"image does not load: {b}" for b in res["badImages"]]
            rep.problems += [f"image without an alt text (its file name instead): {a}" for a in res["noAlt"]]
            rep.problems += sorted({p for h in res["links"] if (p := _link_problem(f, h))})
            rep.problems += [f"struck-through or unclosed markup: {x}" for x in res["struck"]]
            rep.problems += [f"table cell cut short with '...': {x}" for x in res["cut"]]
            rep.problems += text_problems(res["text"], res["prose"])
            rep.math, rep.links = res["mathCount"], len(res["links"])
            safe = name.replace("/", "__")
            page.screenshot(path=str(shots / f"{safe}.png"), full_page=True)
            page.close()
            mob = phone.new_page()
            mob.goto(f.as_uri(), wait_until="load")
            w = mob.evaluate(PHONE_JS)
            if w["page"] > w["view"] + 2:
                rep.problems.append(f"at {w['view']} px (a phone) the page scrolls sideways: it is {w['page']} px wide")
            mob.screenshot(path=str(shots / f"{safe}.phone.png"), full_page=False)
            mob.close()
            reports.append(rep)
        browser.close()
    return reports


def main(argv: list[str]) -> int:
    html = (Path(argv[0]) if argv else ROOT / "_build" / "html").resolve()
    t0 = time.perf_counter()
    reports = check_book(html)
    for r in reports:
        print(f"{'ok  ' if not r.problems else 'FAIL'} {r.page}  ({r.links} links, {r.math} formulas)")
        for p in r.problems:
            print("     ", p)
    bad = sum(bool(r.problems) for r in reports)
    print(f"{len(reports)} pages, {bad} with problems, {time.perf_counter() - t0:.0f} s; "
          f"screenshots in {html.parent / 'screenshots'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
