"""PDF and image attachments (``context=[report.pdf, diagram.png]``), with real files written here: a PDF's text
reaches every seat scrubbed, page by page within the bound, and the report names the pages sent; an image reaches the
seats whose model accepts images in each API's own format, the others get a notice, ``strict_models`` refuses, and an
unsupported type is refused before anything is spent. Requests are counted at the fake provider server."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import subprocess
import sys
import sysconfig
import venv
import zlib
from pathlib import Path
from typing import Any

import pypdf
import pytest
from cli_helpers import clean_env
from test_context import make_settings
from test_engine_support import AGENT_MODELS, JUDGE_MODEL, run_consultation

from conclave.engine.context import MAX_CONTEXT_FILE_BYTES, cut_notices, load_context
from conclave.engine.cost.estimate import IMAGE_TOKENS
from conclave.errors import ConfigError
from conclave.providers.pricing import PriceTable, parse_sheet
from conclave.render.markdown import render_markdown
from conclave.store.paths import StoreLayout
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest
from conclave.testing.pytest_plugin import FAKE_KEYS

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
QUESTION = "Should the billing service move to event sourcing next quarter?"
PAGES = ["The invoice backlog holds 1234 open items.", f"Ops note: the CI prints {AWS_KEY} in its logs.",
         "Replays must be free of side effects."]
#: a seat whose model is text-only in the price sheets (grok-3, on the fake's OpenAI-compatible endpoint)
TEXT_ONLY = ("agents.security.provider=grok", "agents.security.model=grok-3")


def minimal_pdf(pages: list[str]) -> bytes:
    """A hand-written PDF: one Helvetica text line per page."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [%s] /Count %d >>" % (
                   " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages))).encode(), len(pages)),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, text in enumerate(pages):
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode("latin-1")
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >>"
                       b" /Contents %d 0 R >>" % (5 + 2 * i))
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def png(width: int = 2, height: int = 2) -> bytes:
    """A real RGB PNG, written with zlib and struct."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _sent(request: RecordedRequest) -> str:
    return json.dumps(request.json)


# ------------------------------------------------------------------------------------------------------ PDFs


async def test_a_pdf_reaches_every_seat_scrubbed_and_the_report_names_its_pages(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    try:
        import weasyprint  # the pdf extra (in dev); it loads the pango library when imported
    except (ImportError, OSError) as exc:
        pytest.skip(f"WeasyPrint cannot load ({exc}): pip install -e '.[pdf]' and bash .ci/install-system-deps.sh")
    report = tmp_path / "report.pdf"
    html = "".join(f"<p style='break-after: page'>{text}</p>" for text in PAGES)
    report.write_bytes(weasyprint.HTML(string=html).write_pdf())  # a PDF as a real renderer makes it
    run = await run_consultation(fake_provider_server, f"context=[{report}]", "rounds=1")
    agents = [r for r in fake_provider_server.requests if r.model in AGENT_MODELS.values()]
    assert len(agents) == 3
    for request in agents:
        assert "The invoice backlog holds 1234 open items." in _sent(request)
        assert "Replays must be free of side effects." in _sent(request)
        assert AWS_KEY not in _sent(request)
    assert run.result.scrub_report["total"] >= 1
    source = run.result.context_sources[0]
    assert (source["kind"], source["pages"], source["pages_sent"], source["truncated"]) == ("pdf", "pp. 1–3", 3, False)
    assert f"{report} pp. 1–3" in render_markdown(run.result.as_dict())


async def test_pdf_pages_beyond_the_bound_are_cut_and_said(fake_provider_server: FakeProviderServer,
                                                           conclave_env: Any, tmp_path: Path) -> None:
    page = "x" * (MAX_CONTEXT_FILE_BYTES * 2 // 5)  # two pages fit in the bound, the third does not
    report = tmp_path / "big.pdf"
    report.write_bytes(minimal_pdf([f"page{n} " + page for n in range(1, 6)]))
    # models whose windows hold 1.6 MB of text
    run = await run_consultation(fake_provider_server, f"context=[{report}]", "rounds=1",
                                 "agents.security.model=claude-sonnet-4-6", "agents.architect.model=gpt-4.1")
    source = run.result.context_sources[0]
    assert (source["pages"], source["pages_sent"], source["pages_total"], source["truncated"]) == (
        "pp. 1–2 of 5", 2, 5, True)
    sent = _sent(fake_provider_server.requests[0])
    assert "page2 " in sent and "page3 " not in sent
    assert f"{report} pp. 1–2 of 5" in render_markdown(run.result.as_dict())


# ------------------------------------------------------------------------------------------------------ images


async def test_an_image_reaches_vision_seats_in_each_apis_format(fake_provider_server: FakeProviderServer,
                                                                 conclave_env: Any, tmp_path: Path) -> None:
    image = tmp_path / "diagram.png"
    image.write_bytes(png())
    encoded = base64.b64encode(image.read_bytes()).decode()
    await run_consultation(fake_provider_server, f"context=[{image}]", "rounds=1")
    by_model = {r.model: r.json for r in fake_provider_server.requests}
    assert len(fake_provider_server.requests) == 3  # one call per agent, each with the image once
    openai_parts = by_model[AGENT_MODELS["architect"]]["messages"][1]["content"]
    assert openai_parts[0]["type"] == "text"
    assert openai_parts[1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{encoded}"}}
    anthropic_blocks = by_model[AGENT_MODELS["security"]]["messages"][0]["content"]
    assert anthropic_blocks[0] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                               "data": encoded}}
    assert anthropic_blocks[1]["type"] == "text"
    gemini_parts = by_model[AGENT_MODELS["pragmatist"]]["contents"][0]["parts"]
    assert {"inline_data": {"mime_type": "image/png", "data": encoded}} in gemini_parts
    assert all(_sent(r).count(encoded) == 1 for r in fake_provider_server.requests)


async def _cli(fake: FakeProviderServer, home: Path, *overrides: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", QUESTION, *fake.overrides(), "cost.auto_approve=true",
        f"judge.model={JUDGE_MODEL}", *overrides, cwd=home, env=clean_env(home, FAKE_KEYS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_a_text_only_seat_gets_a_notice_and_no_image(fake_provider_server: FakeProviderServer,
                                                          tmp_path: Path) -> None:
    image = tmp_path / "diagram.png"
    image.write_bytes(png())
    encoded = base64.b64encode(image.read_bytes()).decode()
    code, out, err = await _cli(fake_provider_server, tmp_path, *TEXT_ONLY, "rounds=1", "context=[diagram.png]")
    assert code == 0, err
    notices = [line for line in err.splitlines() if "does not accept images" in line]
    assert notices == ["conclave: warning: security (grok/grok-3) does not accept images: it gets the text context without "
                       "diagram.png"]
    grok = [r for r in fake_provider_server.requests if r.model == "grok-3"]
    others = [r for r in fake_provider_server.requests if r.model != "grok-3"]
    assert len(grok) == 1 and encoded not in _sent(grok[0]) and '<image path=\\"diagram.png' in _sent(grok[0])
    assert len(others) == 2 and all(encoded in _sent(r) for r in others)
    assert "diagram.png (image; not sent to security, text-only)" in out
    journal = next(StoreLayout(tmp_path).journal_dir.glob("*.jsonl")).read_text()
    assert '"not_sent_to":["security"]' in journal


async def test_strict_models_refuses_an_image_for_a_text_only_seat(fake_provider_server: FakeProviderServer,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "diagram.png").write_bytes(png())
    code, out, err = await _cli(fake_provider_server, tmp_path, *TEXT_ONLY, "strict_models=true",
                                "context=[diagram.png]")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("conclave: strict_models=true: security (grok/grok-3) cannot take the attached image(s) "
                          "diagram.png")
    assert fake_provider_server.requests == []
    assert not list(StoreLayout(tmp_path).journal_dir.glob("*.jsonl"))


async def test_an_unsupported_type_is_refused_before_anything_is_spent(fake_provider_server: FakeProviderServer,
                                                                       tmp_path: Path) -> None:
    (tmp_path / "report.docx").write_bytes(b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00" + bytes(64))
    code, out, err = await _cli(fake_provider_server, tmp_path, "context=[report.docx]")
    assert code == 2 and out == ""
    assert err == ("conclave: context: report.docx is not a supported type; accepted: text files, PDF (.pdf) and "
                   "images (.png, .jpg, .jpeg, .webp, .gif)\n")
    assert fake_provider_server.requests == []


def test_price_sheets_declare_which_models_take_images() -> None:
    table = PriceTable.load()
    assert table.accepts_images("openai", "gpt-4o") and table.accepts_images("anthropic", "claude-sonnet-4-5")
    assert table.accepts_images("gemini", "models/gemini-2.5-pro")
    assert not table.accepts_images("grok", "grok-3") and not table.accepts_images("openai", "no-such-model")
    with pytest.raises(ValueError, match="vision must be true or false"):
        parse_sheet({"provider": "x", "models": {"m": {"input": 1, "output": 1, "vision": "yes"}}}, "x.yaml")


async def test_the_estimate_counts_each_image_a_vision_seat_is_sent(fake_provider_server: FakeProviderServer,
                                                                    conclave_env: Any, tmp_path: Path) -> None:
    image = tmp_path / "diagram.png"
    image.write_bytes(png())
    plain = await run_consultation(fake_provider_server, "rounds=1", *TEXT_ONLY)
    with_image = await run_consultation(fake_provider_server, f"context=[{image}]", "rounds=1", *TEXT_ONLY)
    table = PriceTable.load()
    # gpt-4o and gemini-2.5-pro take the image (IMAGE_TOKENS each); grok-3 does not
    per_image = sum(price.input for price in (table.price("openai", "gpt-4o"), table.price("gemini", "gemini-2.5-pro"))
                    if price is not None) * IMAGE_TOKENS / 1_000_000
    assert plain.result.cost.estimated is not None and with_image.result.cost.estimated is not None
    difference = with_image.result.cost.estimated - plain.result.cost.estimated
    assert difference == pytest.approx(per_image, abs=0.0005)  # the image's one context line adds a few tokens


# ------------------------------------------------------------------------------------------- PDFs that say nothing


def _settings(*context: Path) -> Any:
    return make_settings([str(p) for p in context])


def test_a_pdf_without_text_is_sent_with_a_notice(tmp_path: Path) -> None:
    scan = tmp_path / "scan.pdf"
    scan.write_bytes(minimal_pdf(["", ""]))  # pages without a text layer, as a scanner makes them
    bundle = load_context(_settings(scan))
    (source,) = bundle.sources
    assert (source["pages"], source["sent"]) == ("pp. 1–2", 0)
    assert cut_notices(bundle.sources) == [f"context file {scan}: no text could be extracted (a scanned PDF?); "
                                           "the panel sees none of it"]


def test_an_encrypted_or_broken_pdf_is_one_line(tmp_path: Path) -> None:
    writer = pypdf.PdfWriter()
    writer.add_blank_page(width=200, height=200)
    writer.encrypt("secret-password")
    locked = tmp_path / "locked.pdf"
    with locked.open("wb") as handle:
        writer.write(handle)
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nthis is not a PDF body\n")
    with pytest.raises(ConfigError) as locked_error:
        load_context(_settings(locked))
    assert locked_error.value.problems == [f"context: {locked} is an encrypted PDF; decrypt it first"]
    with pytest.raises(ConfigError) as broken_error:
        load_context(_settings(broken))
    assert broken_error.value.problems[0].startswith(f"context: cannot read {broken} as a PDF (")


def test_without_the_pdf_extra_a_pdf_context_file_is_one_line_naming_it_exit_2(tmp_path: Path) -> None:
    """An environment that has everything conclave needs but pypdf, as `pip install conclave-council` (without
    ``[pdf]``) gives: a new venv whose site-packages links every installed distribution of this one except pypdf
    (its ``.pth`` files, the editable install's included, are processed as usual)."""
    source = Path(sysconfig.get_paths()["purelib"])
    env_dir = tmp_path / "no-pdf-venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    for entry in source.iterdir():
        if not entry.name.lower().startswith("pypdf") and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    missing = subprocess.run([str(python), "-c", "import pypdf"], capture_output=True, text=True)
    assert missing.returncode == 1 and "No module named 'pypdf'" in missing.stderr
    report = tmp_path / "report.pdf"
    report.write_bytes(minimal_pdf(PAGES))
    done = subprocess.run(
        [str(python), "-m", "conclave", QUESTION, f"context=[{report}]", "agents=openai_only",
         "providers.openai.base_url=http://127.0.0.1:9/v1"],  # nothing listens there: a call would fail, exit 1
        capture_output=True, text=True, cwd=tmp_path, env=clean_env(tmp_path / "home", FAKE_KEYS),
        stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, done.stderr
    assert line.startswith(f"conclave: context: {report} is a PDF; reading PDFs needs pypdf: pip install ")
    assert line.endswith("[pdf]'"), line
