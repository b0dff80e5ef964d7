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
  flush. With ``core_launch = per-step`` that core step takes only the tokens at the head token's loop
  step, as the paper's engine does with a depth-indexed cache; the others keep their place in the queue.
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

from cdbsim.arch import ArchSpec
from cdbsim.blocks import BlockManager
from cdbsim.config import CoreLaunch, Policy, ServeConfig, padding_table, prefill_graph_sizes
from cdbsim.errors import ConfigError
from cdbsim.kv import need_blocks
from cdbsim.launch import Launch, Stage
from cdbsim.requests import RequestTable, Status
from traces.request import Request

WAITING, PREFILLING, DECODING, FINISHED = Status.WAITING, Status.PREFILLING, Status.DECODING, Status.FINISHED


class Scheduler:
    """Plans launches for ``requests`` (indexed by their position in the list) on ``kv_blocks`` blocks.

    ``share_blocks``: attach each item's KV block ids to its launch (:attr:`Launch.blocks`), for a backend
    that addresses a real cache; the simulator leaves it off.
    """

    def __init__(self, arch: ArchSpec, config: ServeConfig, requests: Sequence[Request],
                 kv_blocks: int, share_blocks: bool = False) -> None:
        self.arch = arch
        self.config = config
        self.requests = requests
        bs = config.block_size
        for r in requests:
            need = need_blocks(r.prompt_len, r.output_len, bs)
            if need > kv_blocks:
                raise ConfigError(
                    f"KV capacity of {kv_blocks} blocks ({kv_blocks * bs} tokens) is smaller than request "
                    f"{r.request_id}'s need of {need} blocks ({r.kv_positions} tokens)")
        self.kv = BlockManager(kv_blocks, bs, len(requests))
        self.r_min = config.r_min(arch)
        self.r_max = arch.r_max
        self.table = RequestTable(requests, self.r_min, self.r_max)
        self.share_blocks = share_blocks
        self._width = config.width
        self._pad = padding_table(config.decode_sizes(), config.width)
        self._pad_prefill = padding_table(prefill_graph_sizes(config.prefill_budget), config.prefill_budget)
        self._fill = [config.layout.fill_copies(s, arch.r_max) for s in range(arch.r_max)]
        self._margin_blocks = config.kv_margin * kv_blocks
        # queues
        self.waiting: deque[int] = deque()
        self.prefilling: list[int] = []
        self.prelude_queue: list[int] = []
        self._enter_head: set[int] = set()                # prelude items that join the core queue's head
        self.ready: deque[int] = deque()                  # refill: tokens waiting for their next core step
        self.coda_queue: deque[int] = deque()
        self.pool: deque[int] = deque()                   # cb / norefill: requests with a staged token
        self.stalled: list[tuple[int, bool]] = []         # (request, joins the head) without a KV block
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
        self._per_step = config.core_launch is CoreLaunch.PER_STEP
        self._plan_policy = {Policy.CB: self._plan_cb, Policy.NOREFILL: self._plan_norefill,
                             Policy.REFILL: self._plan_refill}[config.policy]

    @property
    def blocks(self) -> list[list[int]]:
        """Each request's KV block ids (read-only outside the block manager)."""
        return self.kv.blocks

    # ----- driver interface ----------------------------------------------------------------------
    def arrive(self, i: int) -> None:
        """Request ``i`` has arrived: it joins the tail of the waiting queue."""
        status = self.table.status
        if status[i] is not Status.NEW:
            raise ValueError(f"request index {i} arrived twice")
        status[i] = WAITING
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
            self.kv.free(i)
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
        return self._new_launch(Stage.PRELUDE, cohort)

    def _plan_cb(self) -> Launch | None:
        launch = self._try_prefill()
        if launch is not None or not self.pool:
            return launch
        batch = [self.pool.popleft() for _ in range(min(self._width, len(self.pool)))]
        launch = self._new_launch(Stage.DECODE, batch)
        self._produce(batch, self._retire.setdefault(launch.index, []), head=False)
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
        return self._new_launch(Stage.PRELUDE, batch)

    def _loop_step(self, batch: list[int], exited: list[int]) -> tuple[Launch, list[int]]:
        """One core step over ``batch``: tokens at their last step go to ``exited``; returns the launch and
        the tokens that loop again."""
        step, target, fill = self.table.step, self.table.target, self._fill
        steps: list[int] = []
        exits: list[bool] = []
        survivors: list[int] = []
        add_step, add_exit, survive, leave = steps.append, exits.append, survivors.append, exited.append
        copies = 0
        for i in batch:
            s = step[i]
            add_step(s)
            if s + 1 >= target[i]:
                add_exit(True)
                leave(i)
                copies += fill[s]
            else:
                add_exit(False)
                step[i] = s + 1
                survive(i)
        launch = self._new_launch(Stage.CORE, batch)
        launch.steps, launch.exits, launch.kv_copies = steps, exits, copies
        return launch, survivors

    def _launch_core(self) -> Launch:
        ready = self.ready
        if self._per_step:
            batch = self._take_head_step()
        else:
            pop = ready.popleft
            batch = [pop() for _ in range(min(self._width, len(ready)))]
        launch, survivors = self._loop_step(batch, self.coda_queue)  # type: ignore[arg-type]
        ready.extendleft(reversed(survivors))
        return launch

    def _take_head_step(self) -> list[int]:
        """Up to W ready tokens at the head token's loop step; tokens at other steps stay at the head of
        the queue in their order (no-refill waves need no such split: a wave's tokens step together)."""
        ready, step = self.ready, self.table.step
        head_step = step[ready[0]]
        batch: list[int] = []
        deferred: list[int] = []
        while ready and len(batch) < self._width:
            i = ready.popleft()
            (batch if step[i] == head_step else deferred).append(i)
        ready.extendleft(reversed(deferred))
        return batch

    def _launch_wave_step(self, survivors: list[int], exited: list[int]) -> Launch:
        launch, still = self._loop_step(list(survivors), exited)
        self._wave = (still, exited)
        return launch

    def _launch_coda(self, queue: deque[int]) -> Launch:
        batch = [queue.popleft() for _ in range(min(self._width, len(queue)))]
        launch = self._new_launch(Stage.CODA, batch)
        self._produce(batch, self._retire.setdefault(launch.index, []), head=True)
        return launch

    def _try_prefill(self) -> Launch | None:
        """Admit and pack prompt chunks up to the budget M, or None (see the module docstring)."""
        cfg, table, kv = self.config, self.table, self.kv
        status, prefilled, target = table.status, table.prefilled, table.prefill_target
        free_slots = self._width - self.active
        fresh = 0 if self.block_new else min(free_slots, len(self.waiting))
        if not self.prefilling and (fresh == 0 or free_slots < cfg.free_slots_to_admit):
            return None
        if self.decoding and kv.num_free <= self._margin_blocks:
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
            if budget == 0 or (requests and kv.num_free < self._margin_blocks) or not kv.allocate(
                    i, prefilled[i] + min(target[i] - prefilled[i], budget)):
                if status[i] is WAITING:
                    skipped.append(i)
                continue
            if status[i] is WAITING:
                status[i] = PREFILLING
                self.active += 1
                self.prefilling.append(i)
            done = prefilled[i]
            chunk = min(target[i] - done, budget)
            requests.append(i)
            starts.append(done)
            lens.append(chunk)
            prefilled[i] = done + chunk
            budget -= chunk
            finishes.append(done + chunk == target[i])
        self.waiting.extendleft(reversed(skipped))
        if not requests:
            return None
        tokens = sum(lens)
        launch = Launch(index=self.launches, stage=Stage.PREFILL, requests=requests, positions=starts,
                        chunk_lens=lens, finishes=finishes, size=tokens, padded=self._pad_prefill[tokens],
                        context=sum(c * s + c * (c + 1) // 2 for s, c in zip(starts, lens, strict=True)))
        if self.share_blocks:
            launch.blocks = [kv.blocks[i] for i in requests]
            launch.recomputed = [target[i] - table.prompt[i] for i in requests]
        self.launches += 1
        done = [i for i, final in zip(requests, finishes, strict=True) if final]
        for i in done:
            self.prefilling.remove(i)
            status[i] = DECODING
            self.decoding += 1
        self._produce(done, self._retire.setdefault(launch.index, []), head=False)
        return launch

    # ----- token bookkeeping ---------------------------------------------------------------------
    def _produce(self, batch: list[int], retire: list[int], head: bool) -> None:
        """Each request in ``batch`` produced a token: finish it, or stage its next token."""
        table, kv = self.table, self.kv
        generated, output, prompt, position, status = (table.generated, table.output, table.prompt,
                                                        table.position, table.status)
        step, target, depths, loops, blocks = table.step, table.target, table.depths, self._loops, kv.blocks
        bs = kv.block_size
        ready = []
        for i in batch:
            g = generated[i] + 1
            generated[i] = g
            p = position[i] = prompt[i] + g - 1
            if g >= output[i]:
                status[i] = FINISHED
                self.decoding -= 1
                retire.append(i)
                continue
            if p // bs >= len(blocks[i]) and not kv.allocate(i, p + 1):
                self.stalled.append((i, head))
                continue
            step[i] = 0
            if loops:
                target[i] = depths[i][g - 1]
            ready.append(i)
        self._enqueue(ready, head)

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
        table = self.table
        for i, head in stalled:
            if self.kv.append(i, table.position[i]):
                table.start_token(i, self._loops)
                self._enqueue([i], head)
            else:
                self.stalled.append((i, head))

    def _preempt(self) -> bool:
        """Nothing can run: recompute the youngest stuck request later, freeing its KV blocks."""
        stuck = [i for i, _ in self.stalled] + self.prefilling
        if self.active <= 1 or not stuck:
            return False
        table = self.table
        victim = min(reversed(stuck), key=table.held_tokens)
        if table.status[victim] is PREFILLING:
            self.prefilling.remove(victim)
        else:
            self.stalled = [(i, h) for i, h in self.stalled if i != victim]
            self.decoding -= 1
            self.recomputes += 1
        self.kv.preempt(victim)
        table.restart(victim)
        self.active -= 1
        self.waiting.append(victim)
        self.block_new = True
        self.preemptions += 1
        return True

    # ----- helpers -------------------------------------------------------------------------------
    def _new_launch(self, stage: Stage, batch: list[int]) -> Launch:
        pos = self.table.position
        positions = [pos[i] for i in batch]
        n = len(batch)
        launch = Launch(index=self.launches, stage=stage, requests=batch, positions=positions, size=n,
                        padded=self._pad[n], context=sum(positions) + n,
                        longest=max(positions) + 1 if positions else 0)
        if self.share_blocks:
            blocks = self.kv.blocks
            launch.blocks = [blocks[i] for i in batch]
        self.launches += 1
        return launch

    def _snapshot(self, launch: Launch) -> None:
        if self.share_blocks:
            launch.dropped = self.kv.take_dropped()
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
