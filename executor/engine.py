"""Run one :class:`~cdbsim.serving.launch.Launch` of the shared scheduler on the device.

The engine owns the paged KV cache, the token store (per request: prompt ids, then each generated token at its
position) and the hidden-state bank (``width`` rows + 1 scratch: each resident request's loop state between
prelude, core and coda; a row from its first prefill chunk until it finishes or is preempted). It learns of the
scheduler only through launches. Decode-type stages read one int32 buffer (:data:`FIELDS` + a block-table row per
padded row); prefill its packed layout (:mod:`executor.prefill`). Padded rows point at the scratch token, the
scratch bank row and the trash block, so they never touch a real request; either buffer is a graph's static input.
With ``live`` the decode-type stages also run each token's own exit gate (:mod:`executor.live_gates`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cdbsim.model.arch import LayerStyle
from cdbsim.serving.config import ServeConfig
from cdbsim.serving.launch import FIELDS, Launch, Stage, table_width
from executor.attention import DecodeAttention, PagedPrefillAttention
from executor.kv_cache import CacheGeometry, PagedKVCache
from executor.live_gates import LiveGates, LiveGateSpec, Track
from executor.model import LoopedLM
from executor.ops import to_device
from executor.prefill import (
    Chunk,
    PrefillLayout,
    PrefillMeta,
    chunk_capacity,
    pack,
    prefill_views,
    scratch_prefill,
)
from executor.rope import RopeTable
from executor.tokens import prompt_ids
from traces.request import Request

_F = {name: i for i, name in enumerate(FIELDS)}


@dataclass
class StageMeta:
    """Device views of one decode-type launch's metadata (one entry per padded row)."""

    tok: torch.Tensor         # flat token-store index of the input token (prelude, decode)
    pos: torch.Tensor         # position of the input token
    bank: torch.Tensor        # hidden-state bank row
    row0: torch.Tensor        # KV row of the position in cache layer 0: block * 16 + pos % 16
    layer_base: torch.Tensor  # core: slot * core layers (the row's slot); else 0
    fill: torch.Tensor        # core: deeper slots an exiting token also writes (last-exited fill)
    out: torch.Tensor         # flat token-store index the sampled token goes to (coda, decode)
    seq_len: torch.Tensor     # positions attended: pos + 1
    block_table: torch.Tensor  # [rows, width] block ids (trash block beyond the request's blocks)


@dataclass
class Prepared:
    """A launch with its host-side inputs, ready to be put on the device."""

    launch: Launch
    meta: np.ndarray | None = None          # the metadata buffer (engine layouts: FIELDS, executor.prefill)
    width: int = 0
    max_fill: int = 0
    rows: list[tuple[int, int]] | None = None  # (request, output-token index) of each sampled row


class Engine:
    """Stage runners over one model, cache, token store and hidden-state bank."""

    def __init__(self, model: LoopedLM, config: ServeConfig, requests: list[Request], kv_blocks: int, *,
                 prompt_seed: int = 0, prompts: Sequence[Sequence[int]] | None = None,
                 live: LiveGateSpec | None = None) -> None:
        cfg = model.config
        self.model = model
        self.config = config
        self.requests = requests
        self.device = model.device
        self.geo = geo = CacheGeometry(cfg.prelude, cfg.core, cfg.coda, cfg.r_max, config.layout, kv_blocks,
                                       config.block_size)
        self.cache = PagedKVCache(geo, cfg.kv_heads, cfg.head_dim, device=self.device, dtype=model.dtype)
        self.scale = cfg.head_dim ** -0.5
        self.stride = max(r.prompt_len + r.output_len for r in requests) + 1  # token-store row: every position
        self.max_blocks = table_width(requests, config.block_size)
        self.rope = RopeTable.build(cfg.head_dim, cfg.rope_theta, self.stride,
                                    interleaved=cfg.style is LayerStyle.HUGINN, device=self.device)
        n = len(requests)
        store = np.zeros((n + 1, self.stride), dtype=np.int64)
        for i, r in enumerate(requests):
            ids = prompt_ids(r.request_id, r.prompt_len, cfg.vocab, prompt_seed) if prompts is None else prompts[i]
            if len(ids) != r.prompt_len:
                raise ValueError(f"request {r.request_id}: {len(ids)} prompt tokens given, its prompt_len is "
                                 f"{r.prompt_len}")
            store[i, : r.prompt_len] = ids
        self.tokens = torch.from_numpy(store.reshape(-1)).to(self.device)
        self.scratch_token = n * self.stride
        # each token-store row's request id (the scratch row's -1), from which a random start state is drawn
        self.request_keys = (torch.tensor([r.request_id for r in requests] + [-1], device=self.device)
                             if cfg.random_state else None)
        width = config.width
        self.bank_state = torch.zeros((width + 1, cfg.hidden), device=self.device, dtype=model.dtype)
        self.bank_inject = torch.zeros_like(self.bank_state) if cfg.style is LayerStyle.HUGINN else None
        self.scratch_row = width
        self.live = LiveGates(model, live, width + 1, self.tokens.numel()) if live is not None else None
        self._spare_rows = list(range(width - 1, -1, -1))
        self.row_of: dict[int, int] = {}
        # host mirrors of every request's block table (``_known``/``_last``: length and last id synced) and bank
        # row, so a launch's metadata is a few numpy gathers
        self._table = np.full((n + 1, self.max_blocks), geo.trash_block, dtype=np.int32)
        self._known = [0] * (n + 1)
        self._last = [-1] * (n + 1)
        self._bank = np.full(n + 1, self.scratch_row, dtype=np.int32)
        self._scratch: dict[int, np.ndarray] = {}  # scratch metadata at the graphs' width, by padded rows
        self._slot_base = np.asarray([geo.slot_of_step(s) * geo.core for s in range(geo.r_max)], dtype=np.int32)
        self._fill_of = np.asarray([geo.fill_count(s) for s in range(geo.r_max)], dtype=np.int32)
        self._prompt = np.asarray([r.prompt_len for r in requests] + [0], dtype=np.int64)
        self.episodes: list[dict[int, list[int]]] = [{} for _ in requests]
        self.track_rows = False  # record (request, token index) of sampled rows and return their logits (keep_logits)
        self.stage_fns = {Stage.PRELUDE: self._prelude, Stage.CORE: self._core, Stage.CODA: self._coda,
                          Stage.DECODE: self._decode, Stage.PREFILL: self._prefill}

    def prepare(self, launch: Launch, width: int | None = None) -> Prepared:
        """Build a launch's host inputs; the launch must carry its block ids (``Scheduler(share_blocks=True)``).
        ``width``: the captured graphs' block-table width (None: as wide as this launch needs)."""
        if launch.blocks is None:
            raise ValueError("the engine needs each item's KV blocks: plan with Scheduler(share_blocks=True)")
        for r in launch.dropped:
            self._forget(r)
        return (self._prepare_prefill if launch.stage is Stage.PREFILL else self._prepare_decode)(launch, width)

    def admit(self, requests: Iterable[int]) -> None:
        """Give each of ``requests`` that has none a hidden-state bank row (at its first prefill chunk)."""
        for r in requests:
            if r not in self.row_of:
                self.row_of[r] = self._bank[r] = self._spare_rows.pop()

    def scratch_meta(self, rows: int, width: int) -> np.ndarray:
        """Metadata of ``rows`` padded rows (scratch token and bank row, trash block, one position); at the graphs'
        width a copy of a template kept per row count."""
        template = self._scratch.get(rows) if width == self.max_blocks else None
        if template is None:
            fields = np.zeros((len(FIELDS), rows), dtype=np.int32)
            fields[_F["tok"]] = fields[_F["out"]] = self.scratch_token
            fields[_F["bank"]] = self.scratch_row
            fields[_F["row0"]] = self.geo.trash_row
            fields[_F["seq_len"]] = 1
            table = np.full((rows, width), self.geo.trash_block, dtype=np.int32)
            template = np.concatenate((fields.reshape(-1), table.reshape(-1)))
            if width == self.max_blocks:
                self._scratch[rows] = template
        return template.copy()

    def _sync_table(self, requests: list[int], block_lists: list[list[int]]) -> None:
        """Copy block ids the scheduler added since the last launch into the host block table."""
        known, last, table = self._known, self._last, self._table
        for r, blocks in zip(requests, block_lists, strict=True):
            n = len(blocks)
            if n != known[r] or (n and blocks[-1] != last[r]):
                table[r, :n] = blocks
                known[r], last[r] = n, blocks[-1] if n else -1

    def _prepare_decode(self, launch: Launch, width: int | None) -> Prepared:
        bs, stride = self.config.block_size, self.stride
        n, rows = len(launch.requests), max(launch.padded, len(launch.requests))
        self._sync_table(launch.requests, launch.blocks)
        req = np.fromiter(launch.requests, np.int32, n)
        pos = np.fromiter(launch.positions, np.int32, n)
        if width is None:  # eager: only as wide as this launch needs
            width = int(pos.max()) // bs + 1 if n else 1
        buf = self.scratch_meta(rows, width)
        fields = buf[: len(FIELDS) * rows].reshape(len(FIELDS), rows)[:, :n]
        table = buf[len(FIELDS) * rows:].reshape(rows, width)
        # blocks past a row's position are its own; attention masks them
        np.take(self._table[:, :width], req, axis=0, out=table[:n])
        block_of_pos, offset = np.divmod(pos, bs)
        block = self._table[req, block_of_pos]
        tok = fields[_F["tok"]]
        np.multiply(req, stride, out=tok)
        tok += pos
        np.add(tok, 1, out=fields[_F["out"]])
        fields[_F["pos"]] = pos
        np.add(pos, 1, out=fields[_F["seq_len"]])
        fields[_F["bank"]] = self._bank[req]
        row0 = fields[_F["row0"]]
        np.multiply(block, bs, out=row0)
        row0 += offset
        max_fill = 0
        if launch.stage is Stage.CORE:
            steps = np.fromiter(launch.steps, np.int32, n)
            fills = fields[_F["fill"]]
            np.multiply(self._fill_of[steps], np.fromiter(launch.exits, np.int32, n), out=fills)
            fields[_F["layer_base"]] = self._slot_base[steps]
            max_fill = int(fills.max()) if n else 0
        rows_out = None
        if self.track_rows and launch.stage in (Stage.CODA, Stage.DECODE):
            rows_out = list(zip(launch.requests, (pos + 1 - self._prompt[req]).tolist(), strict=True))
        return Prepared(launch, meta=buf, width=width, max_fill=max_fill, rows=rows_out)

    def _prepare_prefill(self, launch: Launch, width: int | None) -> Prepared:
        bs, stride = self.config.block_size, self.stride
        tokens = max(launch.padded, launch.size)
        if width is None:  # eager: only as wide as this launch needs
            width = max(-(-(s + n) // bs) for s, n in zip(launch.positions, launch.chunk_lens, strict=True))
        layout = self.prefill_layout(tokens, width)
        chunks, rows_out = [], []
        self.admit(launch.requests)
        self._sync_table(launch.requests, launch.blocks)
        for r, start, n, final, generated_before in zip(launch.requests, launch.positions, launch.chunk_lens,
                                                        launch.finishes, launch.recomputed, strict=True):
            episode = self.episodes[r].setdefault(generated_before, [])
            if start == 0:
                episode.clear()
            episode.append(n)
            chunks.append(Chunk(start, n, self._table[r], r * stride, final))
            if final:
                rows_out.append((r, generated_before))
        buf = pack(layout, chunks, self.scratch_token, self.geo.trash_block, bs)
        return Prepared(launch, meta=buf, width=width, rows=rows_out if self.track_rows else None)

    def scratch(self, stage: Stage, rows: int, width: int) -> np.ndarray:
        """Metadata of a launch of ``rows`` padded rows (tokens for prefill) that touches no request."""
        if stage is Stage.PREFILL:
            return scratch_prefill(self.prefill_layout(rows, width), self.scratch_token, self.geo.trash_block,
                                   self.config.block_size)
        return self.scratch_meta(rows, width)

    def prefill_layout(self, tokens: int, width: int) -> PrefillLayout:
        return PrefillLayout(tokens, chunk_capacity(tokens, self.config.width), width)

    def views(self, stage: Stage, buffer: torch.Tensor, rows: int, width: int) -> StageMeta | PrefillMeta:
        """The device views a stage function reads from its metadata ``buffer``."""
        if stage is Stage.PREFILL:
            return prefill_views(buffer, self.prefill_layout(rows, width))
        fields = buffer[: len(FIELDS) * rows].view(len(FIELDS), rows)
        return StageMeta(*fields.unbind(0), block_table=buffer[len(FIELDS) * rows:].view(rows, width))

    def warmup_prefill(self, tokens: int = 16) -> None:
        """One prefill of ``tokens`` padding tokens (no request touched), so compilation stays out of timed runs."""
        n = max(1, min(tokens, self.stride - 1))
        width = -(-n // self.config.block_size)
        meta = torch.from_numpy(self.scratch(Stage.PREFILL, n, width)).to(self.device)
        self._prefill(self.views(Stage.PREFILL, meta, n, width))

    def fill_random(self, seed: int = 0) -> None:
        """Random KV contents and loop states, for timing stages outside a run (zeros run faster than real data)."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for tensor in (self.cache.k, self.cache.v, self.bank_state, self.bank_inject):
            if tensor is not None:
                tensor.normal_(generator=gen)

    def release(self, finished: list[int]) -> None:
        """The scheduler finished these requests: give their bank rows back."""
        for r in finished:
            self._forget(r)

    def _forget(self, r: int) -> None:
        """Request ``r`` holds no bank row and no blocks any more (finished or preempted)."""
        row = self.row_of.pop(r, None)
        if row is not None:
            self._spare_rows.append(row)
            self._bank[r] = self.scratch_row
        self._table[r] = self.geo.trash_block
        self._known[r], self._last[r] = 0, -1

    def output_tokens(self) -> list[np.ndarray]:
        store = self.tokens.view(len(self.requests) + 1, self.stride).cpu().numpy()
        return [store[i, r.prompt_len: r.prompt_len + r.output_len].copy() for i, r in enumerate(self.requests)]

    def run_eager(self, prepared: Prepared) -> torch.Tensor | None:
        """Run a prepared launch without graphs; returns the logits of its sampled rows (or None)."""
        launch = prepared.launch
        rows = max(launch.padded, launch.size if launch.stage is Stage.PREFILL else len(launch.requests))
        buffer = to_device(prepared.meta, self.device)
        return self.stage_fns[launch.stage](self.views(launch.stage, buffer, rows, prepared.width),
                                            prepared.max_fill)

    def _attention(self, m: StageMeta, max_fill: int) -> DecodeAttention:
        return DecodeAttention(self.model.ops, self.cache, self.rope, m.pos, m.row0, m.layer_base, m.fill,
                               m.seq_len, m.block_table, max_fill, self.scale)

    def _start_state(self, e: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The loop state before step 0 of the tokens at token-store indices ``tok`` (positions ``pos``)."""
        if self.request_keys is None:
            return self.model.initial_state(e)
        return self.model.initial_state(e, self.request_keys[tok.long() // self.stride], pos)

    def _prelude(self, m: StageMeta, max_fill: int = 0) -> None:
        model = self.model
        e = model.prelude(self.tokens[m.tok.long()], self._attention(m, 0))
        rows = m.bank.long()
        self.bank_state.index_copy_(0, rows, self._start_state(e, m.tok, m.pos))
        if self.bank_inject is not None:
            self.bank_inject.index_copy_(0, rows, e)
        if self.live is not None:
            self.live.start(rows)

    def _core(self, m: StageMeta, max_fill: int = 0) -> None:
        rows = m.bank.long()
        before = self.bank_state[rows]
        e = self.bank_inject[rows] if self.bank_inject is not None else None
        s = self.model.core_step(before, e, self._attention(m, max_fill), self.geo.core_layer(0))
        self.bank_state.index_copy_(0, rows, s)
        if self.live is not None:
            self.live.step(rows, before, s)

    def _coda(self, m: StageMeta, max_fill: int = 0) -> torch.Tensor:
        rows = m.bank.long()
        h = self.model.coda(self.bank_state[rows], self._attention(m, 0), self.geo.coda_layer(0))
        if self.live is not None:
            self.live.finish(rows, m.out)
        return self._sample(h, m.out)

    def _decode(self, m: StageMeta, max_fill: int = 0) -> torch.Tensor:
        track = Track.fresh(m.tok.shape[0], self.device) if self.live is not None else None
        h = self._full_depth(m.tok, m.pos, self._attention(m, 0), track)
        if track is not None:
            self.live.record(track.first, track.ran, m.out)
        return self._sample(h, m.out)

    def _full_depth(self, tok: torch.Tensor, pos: torch.Tensor, attn, track: Track | None = None) -> torch.Tensor:
        """Prelude, every loop and the coda of the tokens at ``tok`` (positions ``pos``): the hidden states the head
        reads; with ``track`` each loop advances the live gates."""
        model, geo = self.model, self.geo
        e = model.prelude(self.tokens[tok.long()], attn)
        s = self._start_state(e, tok, pos)
        for step in range(geo.r_max):
            before = s
            s = model.core_step(s, e, attn, geo.core_layer(geo.slot_of_step(step)))
            if track is not None:
                self.live.advance(track, before, s)
        return model.coda(s, attn, geo.coda_layer(0))

    def _sample(self, h: torch.Tensor, out: torch.Tensor) -> torch.Tensor | None:
        """Greedy tokens into the token store; the logits only while rows are tracked, so that a captured graph keeps
        no output of its own and the graphs' pool reuses the memory."""
        logits = self.model.logits(h)
        self.tokens.index_copy_(0, out.long(), logits.argmax(dim=-1))
        return logits if self.track_rows else None

    def _prefill(self, m: PrefillMeta, max_fill: int = 0) -> torch.Tensor:
        """Packed chunks at full depth; samples the last token of every finishing chunk (padded rows write
        the scratch token). Coda layers run for every token: they write the chunk's coda KV."""
        h = self._full_depth(m.tok, m.pos, PagedPrefillAttention(self.model.ops, self.cache, self.rope, m, self.scale))
        return self._sample(h[m.last.long()], m.out)
