"""The council as an OpenAI-compatible model: ``conclave serve --openai`` adds ``/v1/models`` and
``/v1/chat/completions`` to the live view's server (same port, same token, same guard, same journal).

- :mod:`.chat_request`: a request's model name and messages → the panel, mode, question, context and parent;
- :mod:`.chat_answer`: a consultation's result → the answer text and the ``conclave`` extra field;
- :mod:`.chat_door`: the aiohttp routes, the cost gate's refusal, streaming.
"""
