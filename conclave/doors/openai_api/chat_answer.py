"""A consultation's result as a chat answer: the verdict in prose (in ``answer`` mode the final answer first), the
dissent, and a last line naming the consultation (``— conclave c-… · status · rounds · cost``), which is how a
client that sends back only the text still continues this consultation. The ``conclave`` extra field carries the
id and where the records are."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.render.nodes import Bullets, Node, Para, to_markdown
from conclave.render.renderers import dissent_lines, pct, render_artifact
from conclave.store.paths import StoreLayout


def answer_text(result: Mapping[str, Any]) -> str:
    """The verdict in prose, its confidence and dissent, and the closing line."""
    verdict = result.get("verdict") if isinstance(result.get("verdict"), Mapping) else {}
    assert isinstance(verdict, Mapping)
    nodes: list[Node] = []
    final = str(verdict.get("final_answer") or "").strip()
    if final:  # answer mode: the answer itself comes first, then why
        nodes.append(Para(final))
        if verdict.get("recommendation"):
            nodes.append(Para(str(verdict["recommendation"])))
    elif verdict:
        nodes.extend(render_artifact(verdict))
    elif result.get("recommendation"):
        nodes.append(Para(str(result["recommendation"])))
    else:
        reason = f": {result['abort_reason']}" if result.get("abort_reason") else ""
        nodes.append(Para(f"No verdict was reached ({result.get('status')}{reason})."))
    confidence = verdict.get("confidence", result.get("confidence"))
    if confidence is not None:
        nodes.append(Para(f"Confidence {pct(confidence)}."))
    dissent = dissent_lines(result.get("dissent"))
    if dissent:
        nodes.append(Bullets(dissent, label="Dissent"))
    return to_markdown(nodes).rstrip("\n") + "\n\n" + closing_line(result)


def closing_line(result: Mapping[str, Any]) -> str:
    cost = result.get("cost") if isinstance(result.get("cost"), Mapping) else {}
    assert isinstance(cost, Mapping)
    actual = cost.get("actual")
    spent = f" · ${actual:.4f}" if isinstance(actual, int | float) else ""
    return (f"— conclave {result.get('consultation_id')} · {result.get('status')} · "
            f"{result.get('completed_rounds')} rounds{spent}")


def extra_field(result: Mapping[str, Any], layout: StoreLayout, parent: str | None) -> dict[str, Any]:
    """The ``conclave`` field of a response: the consultation id, how it ended, and where its records are (the
    journal and index relative to the server's data home, whose path a caller is not shown; the live page and report
    on this server)."""
    cid = str(result.get("consultation_id"))
    cost = result.get("cost") if isinstance(result.get("cost"), Mapping) else {}
    assert isinstance(cost, Mapping)
    return {
        "id": cid,
        "status": result.get("status"),
        "parent": parent,
        "confidence": result.get("confidence"),
        "cost": cost.get("actual"),
        "journal": layout.journal_path(cid).relative_to(layout.home).as_posix(),
        "index": layout.index_path.relative_to(layout.home).as_posix(),
        "live": f"/c/{cid}",
        "report": f"/c/{cid}/report",
    }


def usage(result: Mapping[str, Any]) -> dict[str, int]:
    """The tokens every provider call of the consultation billed, in OpenAI's usage shape."""
    tokens = result.get("tokens") if isinstance(result.get("tokens"), Mapping) else {}
    assert isinstance(tokens, Mapping)
    prompt, completion = int(tokens.get("input") or 0), int(tokens.get("output") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
