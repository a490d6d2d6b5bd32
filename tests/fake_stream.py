"""What the stand-in servers (fake_llama_server.py, fake_vllm_server.py) share: one server-sent event
written as one chunk of a chunked HTTP response, as a streaming server writes it."""

import json


def event(wfile, chunk) -> None:
    """`data: <chunk as JSON, or as given where it is text (OpenAI's [DONE])>` and a blank line."""
    data = f"data: {chunk if isinstance(chunk, str) else json.dumps(chunk)}\n\n".encode()
    wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    wfile.flush()
