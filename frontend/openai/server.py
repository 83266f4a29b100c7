"""Entry point of the OpenAI-compatible frontend process (uvicorn+httptools).

`python -m tritond.frontend.openai.server <options-json>`, started by the supervisor when
`--openai-port` is given. It binds like the HTTP frontend (loopback unless an address is
given), serves TLS with the HTTP certificate settings when HTTP uses TLS (SIGHUP reloads them),
and keeps HTTP's connection limits and restricted APIs.
"""
from __future__ import annotations

import logging
import sys

import uvloop

from tritond.shm.heap import keep_large_allocations
from tritond.wire.options import ServerOptions

from ..client_subject import subject_rules
from ..http.limits import HttpLimits
from ..http.peers import PeerCertificates
from ..http.server import listen_socket, serve_uvicorn
from ..metrics import MetricsEndpoint
from ..process import frontend_dataplane, start_process
from ..tls import Reloader, SwappableContext, TlsError, TlsFiles, load
from .app import HttpRestrictions, OpenAIApi
from .tokenizer import Tokenizer, TokenizerError

log = logging.getLogger("tritond.openai")


async def run(opts: ServerOptions, tokenizer: Tokenizer | None) -> None:
    cfg = opts.openai
    assert cfg is not None
    files = TlsFiles.from_options("http", cfg.tls)
    tls = SwappableContext(load(files)) if files is not None else None
    reloader = (Reloader(files, lambda material: tls.build(material), tls.use)
                if files is not None and tls is not None else None)
    subjects = subject_rules(opts.http_restricted_subjects)
    peers = PeerCertificates() if subjects else None
    http = HttpRestrictions(opts.http_restricted, subjects, peers.certificate if peers else None)
    async with frontend_dataplane(opts, "openai", reloader.reload if reloader else None) as (
            dataplane, stop, listening):
        metrics = MetricsEndpoint(dataplane.client, opts) if opts.metrics_port else None   # sampled once scraped
        api = OpenAIApi(dataplane, cfg, tokenizer, opts.http_max_input_size, metrics, opts.strict_readiness,
                        explicit=opts.model_control_mode == "explicit", http=http)
        sock = listen_socket(cfg.address, cfg.port)
        listening()
        await serve_uvicorn(api.app(), sock, stop, HttpLimits.from_options(opts.http_limits), tls, peers)


def main(argv: list[str]) -> int:
    opts = start_process(argv, "openai")
    keep_large_allocations()
    cfg = opts.openai
    if cfg is None:
        log.error("the OpenAI frontend was started without --openai-port")
        return 1
    try:
        tokenizer = Tokenizer(cfg.tokenizer, cfg.chat_template) if cfg.tokenizer or cfg.chat_template else None
    except TokenizerError as e:
        log.error("OpenAI frontend: %s", e)
        return 1
    if tokenizer is None or tokenizer.template is None:
        log.warning("OpenAI frontend without a chat template (--tokenizer DIR or --chat-template FILE): "
                    "/v1/chat/completions answers 500 'Unknown tokenizer'")
    try:
        uvloop.run(run(opts, tokenizer))
    except TlsError as e:
        log.error("OpenAI frontend cannot serve TLS: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
