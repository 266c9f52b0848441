"""Speech to text through an OpenAI-compatible ``/audio/transcriptions`` endpoint.

OpenAI's, or a local Whisper server that speaks the same API (faster-whisper-server,
whisper.cpp's server, LocalAI…). The ``openai`` SDK is imported when this is built:
only when ``[openai] transcription_model`` is set.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..config import PLACEHOLDER_KEY, OpenAIConfig
from .inbound import TranscriptionFailed

MAX_AUDIO_BYTES = 25 * 1000**2  # OpenAI's limit for one file


class Transcriber:
    def __init__(self, config: OpenAIConfig, api_key: str | None) -> None:
        import openai

        assert config.transcription_model is not None
        self.model = config.transcription_model
        self._errors = openai.OpenAIError
        self.client = openai.AsyncOpenAI(
            base_url=config.transcription_base_url or config.base_url,
            api_key=api_key or PLACEHOLDER_KEY,
            timeout=config.timeout.total_seconds(),
            max_retries=config.max_retries,
        )

    async def __call__(self, path: Path, name: str) -> str:
        size = (await asyncio.to_thread(path.stat)).st_size
        if size > MAX_AUDIO_BYTES:
            raise TranscriptionFailed("the recording is over 25 MB, more than the API takes")
        data = await asyncio.to_thread(path.read_bytes)
        try:
            result = await self.client.audio.transcriptions.create(
                model=self.model, file=(name, data)
            )
        except self._errors as exc:
            status = getattr(exc, "status_code", None)
            detail = f" (HTTP {status})" if status else ""
            raise TranscriptionFailed(f"the transcription service failed{detail}") from exc
        except ValueError as exc:  # a 200 whose body is not JSON
            raise TranscriptionFailed("the transcription service answered unreadably") from exc
        text = getattr(result, "text", None)
        if not isinstance(text, str):
            raise TranscriptionFailed("the transcription service gave no text")
        return text

    async def close(self) -> None:
        await self.client.close()
