"""The enums of the pipeline configs (MAX's ``config_enums`` and the TTS/metrics enums).

`SupportedEncoding` and `RepoType` are defined in ``hf_utils`` (which inspects
weight files) and re-exported here.

Example:
    >>> PipelineRole("prefill_only").uses_dispatch_service, RopeType.neox.value
    (True, 'neox')
"""

from __future__ import annotations

import enum

from maxfx.pipelines.lib.hf_utils import RepoType, SupportedEncoding

__all__ = [
    "PipelineRole",
    "PrependPromptSpeechTokens",
    "PrometheusMetricsMode",
    "RepoType",
    "RopeType",
    "SupportedEncoding",
]


class PipelineRole(str, enum.Enum):
    """Whether a pipeline prefills, decodes, or both (disaggregated serving)."""

    PrefillAndDecode = "prefill_and_decode"
    PrefillOnly = "prefill_only"
    DecodeOnly = "decode_only"

    @property
    def uses_dispatch_service(self) -> bool:
        """True for the prefill-only and decode-only roles, whose schedulers talk to a peer."""
        return self in (PipelineRole.PrefillOnly, PipelineRole.DecodeOnly)


class RopeType(str, enum.Enum):
    """Rotary embedding flavour to force for GGUF weights (llama.cpp's names)."""

    none = "none"
    normal = "normal"
    neox = "neox"
    longrope = "longrope"
    yarn = "yarn"


class PrometheusMetricsMode(str, enum.Enum):
    """How Prometheus metrics are exported."""

    INSTRUMENT_ONLY = "instrument_only"
    """Record metrics; the application serves them."""
    LAUNCH_SERVER = "launch_server"
    """Start a metrics server."""
    LAUNCH_MULTIPROC_SERVER = "launch_multiproc_server"
    """Start a multiprocess-mode metrics server."""


class PrependPromptSpeechTokens(str, enum.Enum):
    """When the prompt's speech tokens are given to the audio decoder (TTS)."""

    NEVER = "never"
    """Never forward prompt speech tokens."""
    ONCE = "once"
    """Only to the first block."""
    ROLLING = "rolling"
    """To the first block, and to later ones to fill the buffer."""
