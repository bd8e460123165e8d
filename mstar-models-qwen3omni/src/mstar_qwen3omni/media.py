"""Media decoding with limits, for the preprocess pool: images (Pillow), audio (soundfile, or
PyAV for what libsndfile cannot read; ``soxr`` resamples to the feature extractor's rate) and
video (PyAV: frames sampled at a fixed rate, and optionally the audio track).

    limits = MediaLimits(allowed_domains=("example.com",))
    raw = fetch_bytes(url, limits, part="messages[0].content[1] (image_url)")
    image = decode_image(raw, limits, part)                      # PIL.Image, RGB
    wave = decode_audio(raw, limits, part, rate=16000)           # float32 mono numpy
    video = decode_video(raw, limits, part, fps=2.0, temporal_patch_size=2, audio_rate=16000)

Every failure is a ``ValueError`` whose message starts with the part's name: undecodable data,
a media type that does not match, a part over a limit (bytes, pixels, seconds, frames), a remote
URL whose host is not allowed.

Per request (``MediaBudget``, one per request, passed to each decode): at most ``max_media_parts``
media parts, ``max_request_pixels`` decoded pixels over all images and sampled video frames, and
``max_request_audio_seconds`` of audio over all audio parts and video tracks. A small file can
declare a lot (a 6 KB mp4 of 64 blank 720p frames, a 4 KB PNG of 6000x6000 pixels), so sizes are
checked from the headers before anything is decoded (an image's width and height; a video's
frame size times the frames its duration and frame count say will be sampled; an audio file's
duration and rate), and again while decoding, for headers that understate. Video frames are
decoded one at a time and only the sampled ones are kept; audio is decoded in blocks. ``data:`` URLs and bare base64 always work; ``http(s)`` URLs only
for hosts in ``allowed_domains`` (a host matches a domain or any of its subdomains).
"""

from __future__ import annotations

import base64
import binascii
import io
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np


@dataclass(frozen=True)
class MediaLimits:
    max_bytes: int = 50 * 1024 * 1024  # encoded size of one part
    max_image_pixels: int = 40_000_000  # width * height of one decoded image
    max_audio_seconds: float = 600.0
    max_video_seconds: float = 600.0
    max_video_frames: int = 768  # sampled frames of one video
    max_request_pixels: int = 40_000_000  # decoded pixels of all images and sampled video frames of a request
    max_request_audio_seconds: float = 600.0  # all audio of a request (parts and video tracks)
    max_media_parts: int = 32  # media parts of a request
    allowed_domains: tuple[str, ...] = field(default_factory=tuple)
    fetch_timeout_s: float = 10.0


@dataclass
class DecodedVideo:
    frames: np.ndarray  # (frames, height, width, 3) uint8, sampled at ``fps``
    fps: float
    audio: np.ndarray | None  # float32 mono at the requested rate; None without an audio track


class MediaBudget:
    """What one request's media may still decode (``MediaLimits``' per-request limits)."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limits = limits
        self.parts = 0
        self.pixels = 0
        self.audio_seconds = 0.0

    def add_part(self, part: str) -> None:
        self.parts += 1
        if self.parts > self.limits.max_media_parts:
            raise ValueError(f"{part}: over the limit of {self.limits.max_media_parts} media parts per request")

    def check_pixels(self, pixels: int, part: str, what: str) -> None:
        """A 400 when ``pixels`` more would pass the request's limit (nothing is taken)."""
        limit = self.limits.max_request_pixels
        if self.pixels + pixels > limit:
            already = f" after {self.pixels} pixels in earlier parts" if self.pixels else ""
            raise ValueError(f"{part}: {what} would decode {pixels} pixels{already}, over the limit of {limit} "
                             f"decoded pixels per request (max_request_pixels)")

    def take_pixels(self, pixels: int, part: str, what: str) -> None:
        self.check_pixels(pixels, part, what)
        self.pixels += pixels

    def audio_left(self) -> float:
        return max(0.0, self.limits.max_request_audio_seconds - self.audio_seconds)

    def check_audio(self, seconds: float, part: str) -> None:
        """A 400 when ``seconds`` more would pass the request's limit (nothing is taken)."""
        limit = self.limits.max_request_audio_seconds
        if self.audio_seconds + seconds > limit:
            raise ValueError(f"{part}: {seconds:.1f} s of audio would pass the limit of {limit:g} s of audio per request "
                             f"(max_request_audio_seconds)")

    def take_audio(self, seconds: float, part: str) -> None:
        self.check_audio(seconds, part)
        self.audio_seconds += seconds


def _host_allowed(host: str, allowed: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in (a.lower().strip(".") for a in allowed))


def _b64(text: str, limits: MediaLimits, part: str) -> bytes:
    if len(text) * 3 // 4 > limits.max_bytes:
        raise ValueError(f"{part}: over the limit of {limits.max_bytes} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{part}: data is not valid base64") from None


def _check_url(source: str, limits: MediaLimits, part: str) -> None:
    url = urllib.parse.urlsplit(source)
    if url.scheme not in ("http", "https"):
        raise ValueError(f"{part}: URL scheme {url.scheme!r} is not allowed (use a data URL, base64 or http(s))")
    if not limits.allowed_domains or not _host_allowed(url.hostname or "", limits.allowed_domains):
        raise ValueError(f"{part}: remote URL host {url.hostname!r} is not in the allowed media domains")


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is followed only to a URL that passes the same checks as the first one."""

    def __init__(self, limits: MediaLimits, part: str) -> None:
        self.limits = limits
        self.part = part

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        _check_url(newurl, self.limits, self.part)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_bytes(source: str, limits: MediaLimits, part: str) -> bytes:
    """A ``data:`` URL, an allowed ``http(s)`` URL, or bare base64 -> the encoded bytes."""
    if source.startswith("data:"):
        header, sep, payload = source.partition(",")
        if not sep:
            raise ValueError(f"{part}: malformed data URL")
        if header.endswith(";base64"):
            return _b64(payload, limits, part)
        data = urllib.parse.unquote_to_bytes(payload)
    elif "://" in source:
        _check_url(source, limits, part)
        opener = urllib.request.build_opener(_CheckedRedirects(limits, part))
        try:
            with opener.open(source, timeout=limits.fetch_timeout_s) as response:
                data = response.read(limits.max_bytes + 1)
        except OSError as exc:
            raise ValueError(f"{part}: could not fetch {source}: {exc}") from None
    else:
        return _b64(source, limits, part)
    if len(data) > limits.max_bytes:
        raise ValueError(f"{part}: over the limit of {limits.max_bytes} bytes")
    return data


def decode_image(data: bytes, limits: MediaLimits, part: str, budget: MediaBudget | None = None):  # -> PIL.Image.Image
    from PIL import Image, UnidentifiedImageError

    budget = budget if budget is not None else MediaBudget(limits)

    try:
        image = Image.open(io.BytesIO(data))  # lazy: the size is known before pixels are decoded
        width, height = image.size
        if width * height > limits.max_image_pixels:
            raise ValueError(
                f"{part}: image is {width}x{height} = {width * height} pixels, over the limit of {limits.max_image_pixels}"
            )
        budget.take_pixels(width * height, part, f"an image of {width}x{height}")
        image.load()
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError, SyntaxError) as exc:
        raise ValueError(f"{part}: not a decodable image ({exc})") from None
    return image.convert("RGB")


def _resample(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    if rate == target:
        return wave.astype(np.float32, copy=False)
    import soxr

    return soxr.resample(wave, rate, target).astype(np.float32, copy=False)


def decode_audio(
    data: bytes, limits: MediaLimits, part: str, rate: int, fmt: str | None = None, budget: MediaBudget | None = None
) -> np.ndarray:
    """Encoded audio -> float32 mono at ``rate``. ``fmt`` (e.g. OpenAI's ``input_audio.format``)
    must match the container when given."""
    import soundfile as sf
    from mstar.api.audio_input import AudioInputError, read_mono

    budget = budget if budget is not None else MediaBudget(limits)
    try:
        info = sf.info(io.BytesIO(data))
    except (sf.LibsndfileError, RuntimeError, TypeError):
        info = None
    if info is not None:
        if fmt and not _format_matches(fmt, info.format):
            raise ValueError(f"{part}: declared format {fmt!r} but the data is {info.format.lower()}")
        if info.duration > limits.max_audio_seconds:
            raise ValueError(f"{part}: audio is {info.duration:.1f} s, over the limit of {limits.max_audio_seconds} s")
        if info.frames > 0:
            budget.check_audio(info.duration, part)  # declared: refused before decoding
        try:
            wave, source_rate = read_mono(data, min(limits.max_audio_seconds, budget.audio_left()))
        except AudioInputError as exc:
            raise ValueError(f"{part}: {exc}") from None
        budget.take_audio(wave.size / source_rate, part)
        wave = _resample(wave, source_rate, rate)
    else:
        wave = _decode_audio_stream(data, limits, part, rate, fmt, budget)
        if wave is None:
            raise ValueError(f"{part}: not decodable audio" + (f" in format {fmt!r}" if fmt else ""))
    if wave.size == 0:
        raise ValueError(f"{part}: audio has no samples")
    return wave


_SOUNDFILE_NAMES = {"wav": ("WAV", "WAVEX", "RF64"), "flac": ("FLAC",), "ogg": ("OGG",), "mp3": ("MP3",)}


def _format_matches(declared: str, container: str) -> bool:
    return container.upper() in _SOUNDFILE_NAMES.get(declared.lower(), (declared.upper(),))


def _decode_audio_stream(
    data: bytes, limits: MediaLimits, part: str, rate: int, fmt: str | None, budget: MediaBudget
) -> np.ndarray | None:
    """The first audio stream of any container FFmpeg reads (mp3, m4a, webm, a video's track)."""
    import av

    try:
        with av.open(io.BytesIO(data)) as container:
            if fmt and not _container_matches(fmt, container.format.name):
                raise ValueError(f"{part}: declared format {fmt!r} but the data is {container.format.name}")
            if container.duration is not None:  # declared: refused before decoding
                seconds = container.duration / av.time_base
                if seconds > limits.max_audio_seconds + 1:
                    raise ValueError(f"{part}: audio is {seconds:.1f} s, over the limit of {limits.max_audio_seconds} s")
                budget.check_audio(seconds - 1, part)
            wave = _read_audio_track(container, min(limits.max_audio_seconds, budget.audio_left()), part, rate)
    except av.FFmpegError:
        return None
    if wave is not None:
        budget.take_audio(wave.size / rate, part)
    return wave


def _container_matches(declared: str, names: str) -> bool:
    aliases = {"m4a": "mp4", "aac": "aac", "webm": "matroska", "mp3": "mp3", "wav": "wav", "ogg": "ogg", "flac": "flac"}
    want = aliases.get(declared.lower(), declared.lower())
    return any(want == n or n.startswith(want) for n in names.split(","))


def _read_audio_track(container, max_seconds: float, part: str, rate: int) -> np.ndarray | None:
    import av

    streams = [s for s in container.streams if s.type == "audio"]
    if not streams:
        return None
    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    chunks: list[np.ndarray] = []
    samples = 0
    for frame in container.decode(streams[0]):
        for out in resampler.resample(frame):
            chunk = out.to_ndarray().reshape(-1)
            chunks.append(chunk)
            samples += chunk.size
        if samples > max_seconds * rate:
            raise ValueError(f"{part}: audio is over the limit of {max_seconds} s")
    for out in resampler.resample(None):
        chunks.append(out.to_ndarray().reshape(-1))
    return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


def _declared_samples(container, stream, fps: float) -> int | None:  # noqa: ANN001 - PyAV objects
    """How many frames sampling at ``fps`` takes, as the container declares it (its frame count,
    and its duration); None when it declares neither."""
    import av

    counts = []
    if stream.frames:
        counts.append(int(stream.frames))
    if stream.duration is not None and stream.time_base is not None:
        counts.append(int(float(stream.duration * stream.time_base) * fps) + 1)
    elif container.duration is not None:
        counts.append(int(container.duration / av.time_base * fps) + 1)
    return min(counts) if counts else None


def decode_video(
    data: bytes,
    limits: MediaLimits,
    part: str,
    fps: float,
    temporal_patch_size: int,
    audio_rate: int | None = None,
    budget: MediaBudget | None = None,
) -> DecodedVideo:
    """Frames at times k / fps (the first frame shown at or after each time), as many as fill the
    video, rounded down to a multiple of ``temporal_patch_size``; the audio track too when
    ``audio_rate`` is given. The frame size times the frames the container says will be sampled
    is checked against the request's pixels (``budget``) before decoding; each sampled frame is
    taken from it as it is decoded, and only sampled frames are kept."""
    import av

    budget = budget if budget is not None else MediaBudget(limits)
    try:
        container = av.open(io.BytesIO(data))
    except av.FFmpegError as exc:
        raise ValueError(f"{part}: not a decodable video ({exc})") from None
    with container:
        streams = [s for s in container.streams if s.type == "video"]
        if not streams:
            raise ValueError(f"{part}: no video stream")
        stream = streams[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        if width * height > limits.max_image_pixels:
            raise ValueError(
                f"{part}: video frames are {width}x{height} = {width * height} pixels, over the limit of {limits.max_image_pixels}"
            )
        if container.duration is not None and container.duration / av.time_base > limits.max_video_seconds + 1:
            raise ValueError(f"{part}: video is over the limit of {limits.max_video_seconds} s")
        declared = _declared_samples(container, stream, fps)
        if declared is not None:
            if declared > limits.max_video_frames:
                raise ValueError(f"{part}: video samples over the limit of {limits.max_video_frames} frames at {fps} fps "
                                 f"({declared}, as its container declares)")
            budget.check_pixels(declared * width * height, part, f"a video of {declared} sampled {width}x{height} frames")
        frames: list[np.ndarray] = []
        step = Fraction(1) / Fraction(fps).limit_denominator(1000)
        next_time = Fraction(0)
        try:
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = Fraction(frame.pts) * stream.time_base
                if t > limits.max_video_seconds:
                    raise ValueError(f"{part}: video is over the limit of {limits.max_video_seconds} s")
                if t + Fraction(1, 10**6) >= next_time:
                    if frame.width * frame.height > limits.max_image_pixels:
                        raise ValueError(f"{part}: a video frame is {frame.width}x{frame.height} pixels, over the limit of "
                                         f"{limits.max_image_pixels}")
                    budget.take_pixels(frame.width * frame.height, part, f"sampled frame {len(frames) + 1}")
                    frames.append(frame.to_ndarray(format="rgb24"))
                    next_time += step
                    if len(frames) > limits.max_video_frames:
                        raise ValueError(
                            f"{part}: video samples over the limit of {limits.max_video_frames} frames at {fps} fps"
                        )
        except av.FFmpegError as exc:
            raise ValueError(f"{part}: corrupt video ({exc})") from None
        keep = len(frames) // temporal_patch_size * temporal_patch_size
        if keep == 0:
            raise ValueError(f"{part}: video is too short for {temporal_patch_size} frames at {fps} fps")
        audio = None
        if audio_rate is not None:
            container.seek(0)
            audio = _read_audio_track(container, min(limits.max_video_seconds, budget.audio_left()), part, audio_rate)
            if audio is not None:
                budget.take_audio(audio.size / audio_rate, part)
    return DecodedVideo(np.stack(frames[:keep]), float(fps), audio)
