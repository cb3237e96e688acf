"""The fake server's batch APIs, driven by the official SDKs' batch methods (openai, anthropic, google-genai): the
wire formats cannot drift from the real ones unnoticed."""

from __future__ import annotations

import asyncio
import io
import json

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from conclave.testing.fake_server import FakeProviderServer, Fault, Reply


def _chat(model: str, text: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_completion_tokens": 50}


async def test_openai_batch_through_the_sdk() -> None:
    async with FakeProviderServer() as fake:
        fake.script("gpt-4o", lambda r: Fault.server_error() if "fail" in json.dumps(r.json) else Reply(text="ok"))
        fake.batches.latency = 0.3
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake.base_url("openai"))
        lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": _chat("gpt-4o", "fail" if i == 2 else f"q{i}")} for i in range(3)]
        upload = await client.files.create(
            file=("in.jsonl", io.BytesIO("\n".join(json.dumps(x) for x in lines).encode())), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                            completion_window="24h", metadata={"run": "t"})
        assert batch.status == "in_progress" and batch.request_counts.total == 3
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            await asyncio.sleep(0.1)
            batch = await client.batches.retrieve(batch.id)
        assert batch.status == "completed" and batch.request_counts.failed == 1
        output = (await client.files.content(batch.output_file_id)).text.splitlines()
        answers = {json.loads(x)["custom_id"]: json.loads(x)["response"]["body"] for x in output}
        assert sorted(answers) == ["r0", "r1"]
        assert answers["r0"]["choices"][0]["message"]["content"] == "ok"
        errors = [json.loads(x) for x in (await client.files.content(batch.error_file_id)).text.splitlines()]
        assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("r2", 500)]
        assert fake.batches.received == 3 and fake.batches.resubmitted == 0


async def test_openai_batch_cancel_and_expiry() -> None:
    async with FakeProviderServer() as fake:
        fake.batches.latency = 5.0
        fake.batches.outcomes = ["completed", "expired"]
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=fake.base_url("openai"))
        line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                           "body": _chat("gpt-4o", "q")})
        upload = await client.files.create(file=("in.jsonl", io.BytesIO(line.encode())), purpose="batch")
        batch = await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                            completion_window="24h")
        cancelled = await client.batches.cancel(batch.id)
        assert cancelled.status == "cancelled" and cancelled.output_file_id is None
        fake.batches.latency = 0.0
        expired = await client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                              completion_window="24h")
        expired = await client.batches.retrieve(expired.id)
        assert expired.status == "expired"
        error = json.loads((await client.files.content(expired.error_file_id)).text)
        assert error["error"]["code"] == "batch_expired"


async def test_anthropic_message_batch_through_the_sdk() -> None:
    async with FakeProviderServer() as fake:
        fake.script("claude-sonnet-4-5", Reply(text="fine"))
        fake.batches.latency = 0.2
        client = anthropic.AsyncAnthropic(api_key="sk-ant", base_url=fake.base_url("anthropic"))
        batch = await client.messages.batches.create(requests=[
            {"custom_id": f"r{i}", "params": {"model": "claude-sonnet-4-5", "max_tokens": 20,
                                              "messages": [{"role": "user", "content": f"q{i}"}]}}
            for i in range(2)])
        assert batch.processing_status == "in_progress"
        while batch.processing_status != "ended":
            await asyncio.sleep(0.1)
            batch = await client.messages.batches.retrieve(batch.id)
        assert batch.request_counts.succeeded == 2
        results = [r async for r in await client.messages.batches.results(batch.id)]
        assert [(r.custom_id, r.result.type) for r in results] == [("r0", "succeeded"), ("r1", "succeeded")]
        assert results[0].result.message.content[0].text == "fine"


async def test_a_batch_over_the_limit_is_refused() -> None:
    async with FakeProviderServer() as fake:
        fake.batches.limits["anthropic"] = 1
        client = anthropic.AsyncAnthropic(api_key="sk-ant", base_url=fake.base_url("anthropic"), max_retries=0)
        with pytest.raises(anthropic.APIStatusError):
            await client.messages.batches.create(requests=[
                {"custom_id": f"r{i}", "params": {"model": "m", "max_tokens": 5,
                                                  "messages": [{"role": "user", "content": "q"}]}} for i in range(2)])


async def test_gemini_batch_mode_through_the_sdk() -> None:
    async with FakeProviderServer() as fake:
        fake.script("gemini-2.5-flash", Reply(text="fine"))
        fake.batches.latency = 0.2
        client = genai.Client(api_key="g-fake", http_options=types.HttpOptions(
            base_url=fake.url + "/gemini", api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))
        job = await client.aio.batches.create(model="gemini-2.5-flash", src=[
            {"contents": [{"role": "user", "parts": [{"text": f"q{i}"}]}], "metadata": {"key": f"r{i}"}}
            for i in range(2)])
        assert job.state == types.JobState.JOB_STATE_RUNNING and job.name.startswith("batches/")
        while job.state == types.JobState.JOB_STATE_RUNNING:
            await asyncio.sleep(0.1)
            job = await client.aio.batches.get(name=job.name)
        assert job.state == types.JobState.JOB_STATE_SUCCEEDED
        answers = job.dest.inlined_responses
        assert [r.metadata["key"] for r in answers] == ["r0", "r1"] and answers[0].response.text == "fine"
        fake.batches.latency = 60
        cancelled = await client.aio.batches.create(model="gemini-2.5-flash", src=[
            {"contents": [{"role": "user", "parts": [{"text": "q"}]}], "metadata": {"key": "c"}}])
        await client.aio.batches.cancel(name=cancelled.name)
        assert (await client.aio.batches.get(name=cancelled.name)).state == types.JobState.JOB_STATE_CANCELLED


async def test_each_batch_list_pages_newest_first_through_the_sdks() -> None:
    """What a resumed run reads to find a batch it was submitting when it died: the lists, as the SDKs page them."""
    async with FakeProviderServer() as fake:
        fake.batches.latency = 60
        oai = openai.AsyncOpenAI(api_key="sk-test", base_url=fake.base_url("openai"))
        line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                           "body": _chat("gpt-4o", "q")})
        upload = await oai.files.create(file=("in.jsonl", io.BytesIO(line.encode())), purpose="batch")
        made = [await oai.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                         completion_window="24h", metadata={"conclave_batch": f"t{i}"})
                for i in range(3)]
        listed = [b async for b in oai.batches.list(limit=2)]  # the SDK follows `after` over two pages
        assert [b.id for b in listed] == [b.id for b in reversed(made)]
        assert [b.metadata["conclave_batch"] for b in listed] == ["t2", "t1", "t0"]

        ant = anthropic.AsyncAnthropic(api_key="sk-ant", base_url=fake.base_url("anthropic"))
        created = [await ant.messages.batches.create(requests=[
            {"custom_id": f"tag{i}_r", "params": {"model": "claude-sonnet-4-5", "max_tokens": 5,
                                                  "messages": [{"role": "user", "content": "q"}]}}])
            for i in range(3)]
        seen = [b async for b in ant.messages.batches.list(limit=2)]
        assert [b.id for b in seen] == [b.id for b in reversed(created)]
        assert seen[0].request_counts.processing == 1 and seen[0].created_at is not None

        client = genai.Client(api_key="g-fake", http_options=types.HttpOptions(
            base_url=fake.url + "/gemini", api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))
        jobs = [await client.aio.batches.create(model="gemini-2.5-flash", config={"display_name": f"conclave-t{i}"},
                                                src=[{"contents": [{"role": "user", "parts": [{"text": "q"}]}],
                                                      "metadata": {"key": "k"}}]) for i in range(3)]
        pager = await client.aio.batches.list(config={"page_size": 2})
        names = [job async for job in pager]
        assert [j.name for j in names] == [j.name for j in reversed(jobs)]
        assert [j.display_name for j in names] == ["conclave-t2", "conclave-t1", "conclave-t0"]
