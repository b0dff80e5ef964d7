"""The one scheduler that both the simulator and the GPU executor drive.

It is a deterministic state machine: ``arrive(i)`` puts a request in the waiting queue, ``plan()`` returns
the next :class:`~cdbsim.launch.Launch` (or ``None`` when nothing can run yet), ``complete(launch)``
tells it a launch finished. It has no clock: the driver decides when to call what. State moves forward
when a launch is *planned*, because a backend runs launches in order on one stream, so the next launch
may already use what the previous one will produce (a token's next loop step, the coda's output token);
only giving KV blocks and resident slots back waits for ``complete``, so that a backend can still read a
finished request's block table while its last launch runs.

Per request, the life of a generated token under CDB is: prelude (embedding, prelude layers) -> core
steps (one per launch, mixed with other tokens at other steps) -> coda (coda layers, head, sampling);
its exit depth is replayed from the trace, clamped to ``[r_min, r_max]``. Policies:

* ``refill`` (Algorithm 2 of the CDB paper): prelude as soon as tokens exist, then coda if >= K wait (and
  fewer than ``max_coda_in_flight`` codas are in flight), else an admitted prefill, else one core step over
  up to W ready tokens from the head of the queue (survivors go back to the head), else an undersized coda
  flush.
* ``norefill`` (Algorithm 1): prefill while admitted, then one lock-step wave: prelude -> core steps over
  a shrinking batch -> one coda for the whole wave.
* ``cb``: prefill if admitted, else one fused full-depth decode step over up to W requests.

Admission, chunking, queue order and KV pressure follow ``reference/cdb-engine-spec.md``: a prompt is
admitted when no request decodes or more than ``kv_margin`` of the KV blocks are free, and at least
``min_free_slots`` resident slots are free; prompts are chunked to the budget M; a token that cannot get
a KV block stalls, and only when nothing at all can run is the youngest stalled (or prefilling) request
preempted and recomputed later (its re-prefill produces its next token at full depth).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from cdbsim.arch import ArchSpec
from cdbsim.config import Policy, ServeConfig, padding_table, prefill_graph_sizes
from cdbsim.errors import ConfigError
from cdbsim.kv import BlockPool, need_blocks
from cdbsim.launch import Launch, Stage
from traces.request import Request

NEW, WAITING, PREFILLING, DECODING, FINISHED = range(5)


class Scheduler:
    """Plans launches for ``requests`` (indexed by their position in the list) on ``kv_blocks`` blocks."""

    def __init__(self, arch: ArchSpec, config: ServeConfig, requests: Sequence[Request],
                 kv_blocks: int) -> None:
        self.arch = arch
        self.config = config
        self.requests = requests
        self.kv = BlockPool(kv_blocks)
        bs = config.block_size
        for r in requests:
            need = need_blocks(r.prompt_len, r.output_len, bs)
            if need > kv_blocks:
                raise ConfigError(
                    f"KV capacity of {kv_blocks} blocks ({kv_blocks * bs} tokens) is smaller than request "
                    f"{r.request_id}'s need of {need} blocks ({r.kv_positions} tokens)")
        n = len(requests)
        self.r_min = config.r_min(arch)
        self.r_max = arch.r_max
        self._width = config.width
        self._pad = padding_table(config.decode_sizes(), config.width)
        self._pad_prefill = padding_table(prefill_graph_sizes(config.prefill_budget), config.prefill_budget)
        self._fill = [config.layout.fill_copies(s, arch.r_max) for s in range(arch.r_max)]
        self._margin_blocks = config.kv_margin * kv_blocks
        # per-request state, as flat lists for speed
        self.prompt = [r.prompt_len for r in requests]
        self.output = [r.output_len for r in requests]
        low, high = self.r_min, self.r_max
        self.depths = [np.clip(r.depths, low, high).tolist() for r in requests]  # executed depths
        self.status = [NEW] * n
        self.prefill_target = list(self.prompt)
        self.prefilled = [0] * n
        self.generated = [0] * n
        self.position = [p - 1 for p in self.prompt]  # of the latest output token = the next input
        self.step = [0] * n
        self.target = [0] * n
        self.blocks: list[list[int]] = [[] for _ in range(n)]
        # queues
        self.waiting: deque[int] = deque()
        self.prefilling: list[int] = []
        self.prelude_queue: list[int] = []
        self._enter_head: set[int] = set()                # prelude items that join the core queue's head
        self.ready: deque[int] = deque()                  # refill: tokens waiting for their next core step
        self.coda_queue: deque[int] = deque()
        self.pool: deque[int] = deque()                   # cb / norefill: requests with a staged token
        self.stalled: list[tuple[int, bool]] = []
        self._wave: tuple[list[int], list[int]] | None = None  # norefill: (survivors, exited)
        # counters
        self.active = 0
        self.decoding = 0
        self.finished = 0
        self.arrived = 0
        self.preemptions = 0
        self.recomputes = 0  # preemptions of decoding requests: their re-prefill produces a token
        self.block_new = False
        self.in_flight = 0
        self.coda_in_flight = 0
        self.launches = 0
        self._retire: dict[int, list[int]] = {}
        self._loops = config.policy is not Policy.CB        # CDB: tokens carry an exit depth
        self._prelude_first = config.policy is Policy.REFILL  # refill: new tokens go to the prelude queue
        self._plan_policy = {Policy.CB: self._plan_cb, Policy.NOREFILL: self._plan_norefill,
                             Policy.REFILL: self._plan_refill}[config.policy]

    # ----- driver interface ----------------------------------------------------------------------
    def arrive(self, i: int) -> None:
        """Request ``i`` has arrived: it joins the tail of the waiting queue."""
        if self.status[i] != NEW:
            raise ValueError(f"request index {i} arrived twice")
        self.status[i] = WAITING
        self.waiting.append(i)
        self.arrived += 1

    @property
    def done(self) -> bool:
        """Every request has finished and no launch is in flight."""
        return self.finished == len(self.requests) and self.in_flight == 0

    @property
    def has_work(self) -> bool:
        """Some arrived request is not finished yet."""
        return self.finished + (len(self.requests) - self.arrived) < len(self.requests)

    def plan(self) -> Launch | None:
        """The next launch, or None if nothing can run until a launch completes or a request arrives."""
        if self.stalled:
            self._restage_stalled()
        launch = self._plan_policy()
        if launch is None and self.in_flight == 0 and self.has_work and self._preempt():
            return self.plan()
        if launch is not None:
            self.in_flight += 1
            if launch.stage is Stage.CODA:
                self.coda_in_flight += 1
            self._snapshot(launch)
        return launch

    def complete(self, launch: Launch) -> list[int]:
        """``launch`` finished on the device; returns the requests it finished (their KV is freed)."""
        self.in_flight -= 1
        if launch.stage is Stage.CODA:
            self.coda_in_flight -= 1
        done = self._retire.pop(launch.index, [])
        for i in done:
            self.kv.give_back(self.blocks[i])
            self.active -= 1
            self.finished += 1
            self.block_new = False
        return done

    # ----- policies ------------------------------------------------------------------------------
    def _plan_refill(self) -> Launch | None:
        if self.prelude_queue:
            return self._launch_prelude()
        can_coda = self.coda_in_flight < self.config.max_coda_in_flight
        if can_coda and len(self.coda_queue) >= self.config.coda_batch:
            return self._launch_coda(self.coda_queue)
        launch = self._try_prefill()
        if launch is not None:
            return launch
        if self.ready:
            return self._launch_core()
        if can_coda and self.coda_queue:
            return self._launch_coda(self.coda_queue)
        return None

    def _plan_norefill(self) -> Launch | None:
        if self._wave is not None:
            survivors, exited = self._wave
            if survivors:
                return self._launch_wave_step(survivors, exited)
            if self.coda_in_flight >= self.config.max_coda_in_flight:
                return None
            self._wave = None
            return self._launch_coda(deque(exited))
        launch = self._try_prefill()
        if launch is not None or not self.pool:
            return launch
        cohort = [self.pool.popleft() for _ in range(min(self._width, len(self.pool)))]
        self._wave = (list(cohort), [])
        return self._new_launch(Stage.PRELUDE, cohort, self._positions(cohort))

    def _plan_cb(self) -> Launch | None:
        launch = self._try_prefill()
        if launch is not None or not self.pool:
            return launch
        batch = [self.pool.popleft() for _ in range(min(self._width, len(self.pool)))]
        positions = self._positions(batch)
        launch = self._new_launch(Stage.DECODE, batch, positions)
        retire = self._retire.setdefault(launch.index, [])
        self._produce(batch, retire, head=False)
        return launch

    # ----- stage launches ------------------------------------------------------------------------
    def _launch_prelude(self) -> Launch:
        batch = self.prelude_queue[: self._width]
        del self.prelude_queue[: self._width]
        heads = self._enter_head
        if heads:
            self.ready.extendleft(reversed([i for i in batch if i in heads]))
            self.ready.extend(i for i in batch if i not in heads)
            heads.difference_update(batch)
        else:
            self.ready.extend(batch)
        return self._new_launch(Stage.PRELUDE, batch, self._positions(batch))

    def _launch_core(self) -> Launch:
        ready, step, target, fill = self.ready, self.step, self.target, self._fill
        pop = ready.popleft
        batch = [pop() for _ in range(min(self._width, len(ready)))]
        steps: list[int] = []
        exits: list[bool] = []
        survivors: list[int] = []
        add_step, add_exit, survive, to_coda = steps.append, exits.append, survivors.append, self.coda_queue.append
        copies = 0
        for i in batch:
            s = step[i]
            add_step(s)
            if s + 1 >= target[i]:
                add_exit(True)
                to_coda(i)
                copies += fill[s]
            else:
                add_exit(False)
                step[i] = s + 1
                survive(i)
        ready.extendleft(reversed(survivors))
        launch = self._new_launch(Stage.CORE, batch, self._positions(batch))
        launch.steps, launch.exits, launch.kv_copies = steps, exits, copies
        return launch

    def _launch_wave_step(self, survivors: list[int], exited: list[int]) -> Launch:
        step, target, fill = self.step, self.target, self._fill
        steps, exits, still = [], [], []
        copies = 0
        for i in survivors:
            s = step[i]
            steps.append(s)
            if s + 1 >= target[i]:
                exits.append(True)
                exited.append(i)
                copies += fill[s]
            else:
                exits.append(False)
                step[i] = s + 1
                still.append(i)
        launch = self._new_launch(Stage.CORE, list(survivors), self._positions(survivors))
        launch.steps, launch.exits, launch.kv_copies = steps, exits, copies
        self._wave = (still, exited)
        return launch

    def _launch_coda(self, queue: deque[int]) -> Launch:
        batch = [queue.popleft() for _ in range(min(self._width, len(queue)))]
        launch = self._new_launch(Stage.CODA, batch, self._positions(batch))
        self._produce(batch, self._retire.setdefault(launch.index, []), head=True)
        return launch

    def _try_prefill(self) -> Launch | None:
        """Admit and pack prompt chunks up to the budget M, or None (see the module docstring)."""
        cfg = self.config
        free_slots = self._width - self.active
        fresh = 0 if self.block_new else min(free_slots, len(self.waiting))
        if not self.prefilling and (fresh == 0 or free_slots < cfg.free_slots_to_admit):
            return None
        if self.decoding and self.kv.free <= self._margin_blocks:
            return None
        budget = cfg.prefill_budget
        requests: list[int] = []
        starts: list[int] = []
        lens: list[int] = []
        finishes: list[bool] = []
        candidates = list(self.prefilling)
        taken_fresh = [self.waiting.popleft() for _ in range(fresh)]
        skipped: list[int] = []
        for i in candidates + taken_fresh:
            if budget == 0 or (requests and self.kv.free < self._margin_blocks):
                if self.status[i] == WAITING:
                    skipped.append(i)
                continue
            done = self.prefilled[i]
            chunk = min(self.prefill_target[i] - done, budget)
            need = -(-(done + chunk) // cfg.block_size) - len(self.blocks[i])
            if not self.kv.take(need, self.blocks[i]):
                if self.status[i] == WAITING:
                    skipped.append(i)
                continue
            if self.status[i] == WAITING:
                self.status[i] = PREFILLING
                self.active += 1
                self.prefilling.append(i)
            requests.append(i)
            starts.append(done)
            lens.append(chunk)
            self.prefilled[i] = done + chunk
            budget -= chunk
            finishes.append(done + chunk == self.prefill_target[i])
        self.waiting.extendleft(reversed(skipped))
        if not requests:
            return None
        tokens = sum(lens)
        launch = Launch(index=self.launches, stage=Stage.PREFILL, requests=requests, positions=starts,
                        chunk_lens=lens, finishes=finishes, size=tokens, padded=self._pad_prefill[tokens],
                        context=sum(c * s + c * (c + 1) // 2 for s, c in zip(starts, lens, strict=True)))
        self.launches += 1
        done = [i for i, final in zip(requests, finishes, strict=True) if final]
        for i in done:
            self.prefilling.remove(i)
            self.status[i] = DECODING
            self.decoding += 1
        self._produce(done, self._retire.setdefault(launch.index, []), head=False)
        return launch

    # ----- token bookkeeping ---------------------------------------------------------------------
    def _produce(self, batch: list[int], retire: list[int], head: bool) -> None:
        """Each request in ``batch`` produced a token: finish it, or stage its next token."""
        generated, output, prompt, blocks = self.generated, self.output, self.prompt, self.blocks
        step, target, depths, loops, position = self.step, self.target, self.depths, self._loops, self.position
        bs = self.config.block_size
        ready = []
        for i in batch:
            g = generated[i] + 1
            generated[i] = g
            position[i] = prompt[i] + g - 1
            if g >= output[i]:
                self.status[i] = FINISHED
                self.decoding -= 1
                retire.append(i)
                continue
            if position[i] // bs >= len(blocks[i]) and not self._allocate(i):
                self.stalled.append((i, head))
                continue
            step[i] = 0
            if loops:
                target[i] = depths[i][g - 1]
            ready.append(i)
        self._enqueue(ready, head)

    def _allocate(self, i: int) -> bool:
        """A KV block for the next decode token of request ``i``; False if none is free."""
        blocks = self.blocks[i]
        need = (self.prompt[i] + self.generated[i] - 1) // self.config.block_size + 1
        return len(blocks) >= need or self.kv.take(need - len(blocks), blocks)

    def _enqueue(self, ready: list[int], head: bool) -> None:
        """Tokens that can run: to the prelude queue (refill) or the pool of staged requests."""
        if self._prelude_first:
            self.prelude_queue.extend(ready)
            if head:
                self._enter_head.update(ready)
        else:
            self.pool.extend(ready)

    def _restage_stalled(self) -> None:
        stalled, self.stalled = self.stalled, []
        for i, head in stalled:
            if self._allocate(i):
                self.step[i] = 0
                if self._loops:
                    self.target[i] = self.depths[i][self.generated[i] - 1]
                self._enqueue([i], head)
            else:
                self.stalled.append((i, head))

    def _preempt(self) -> bool:
        """Nothing can run: recompute the youngest stuck request later, freeing its KV blocks."""
        stuck = [i for i, _ in self.stalled] + self.prefilling
        if self.active <= 1 or not stuck:
            return False
        victim = min(reversed(stuck), key=lambda i: self.prefilled[i] if self.status[i] == PREFILLING
                     else self.prompt[i] + self.generated[i])
        if self.status[victim] == PREFILLING:
            self.prefilling.remove(victim)
        else:
            self.stalled = [(i, h) for i, h in self.stalled if i != victim]
            self.decoding -= 1
            self.recomputes += 1
        self.kv.give_back(self.blocks[victim])
        self.status[victim] = WAITING
        self.prefilled[victim] = 0
        self.prefill_target[victim] = self.prompt[victim] + self.generated[victim]
        self.active -= 1
        self.waiting.append(victim)
        self.block_new = True
        self.preemptions += 1
        return True

    # ----- helpers -------------------------------------------------------------------------------
    def _positions(self, batch: list[int]) -> list[int]:
        """Position of each request's current input token (its latest output token)."""
        pos = self.position
        return [pos[i] for i in batch]

    def _new_launch(self, stage: Stage, batch: list[int], positions: list[int]) -> Launch:
        n = len(batch)
        launch = Launch(index=self.launches, stage=stage, requests=batch, positions=positions, size=n,
                        padded=self._pad[n], context=sum(positions) + n,
                        longest=max(positions) + 1 if positions else 0)
        self.launches += 1
        return launch

    def _snapshot(self, launch: Launch) -> None:
        launch.queue_waiting = len(self.waiting)
        launch.queue_prelude = len(self.prelude_queue)
        launch.queue_coda = len(self.coda_queue)
        if self.config.policy is Policy.REFILL:
            launch.queue_core = len(self.ready)
        elif self._wave is not None:
            launch.queue_core = len(self._wave[0])
            launch.queue_coda = len(self._wave[1])
        else:
            launch.queue_core = len(self.pool)
        launch.active = self.active
