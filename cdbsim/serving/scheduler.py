"""The one scheduler that both the simulator and the GPU executor drive.

A deterministic state machine without a clock: ``arrive(i)`` queues a request, ``plan()`` returns the next
:class:`~cdbsim.serving.launch.Launch` (or ``None`` when nothing can run yet), ``complete(launch)`` reports that
a launch finished. State moves when a launch is *planned* (a backend runs launches in order on one stream, so the
next launch may use what the previous one produces); only KV blocks and resident slots wait for ``complete``, so
a backend can still read a finished request's block table while its last launch runs.

Under CDB a generated token runs prelude -> core steps (one per launch, mixed with tokens at other steps) -> coda;
its exit depth is replayed from the trace, clamped to ``[r_min, r_max]``. Policies:

* ``refill`` (Algorithm 2 of the CDB paper): prelude as soon as tokens exist, then coda if >= K wait (and fewer
  than ``max_coda_in_flight`` are in flight), else an admitted prefill, else one core step over up to W ready
  tokens from the head of the queue (survivors go back to the head), else an undersized coda flush. With
  ``core_launch = per-step`` a core step takes only the tokens at the head token's loop step.
* ``norefill`` (Algorithm 1): prefill while admitted, then one lock-step wave: prelude -> core steps over a
  shrinking batch -> one coda for the whole wave.
* ``cb``: prefill if admitted, else one fused full-depth decode step over up to W requests.
* ``adaptive``: refill's queues, but the coda (the prelude follows it) and the prefill of arrivals launch only
  when :mod:`cdbsim.serving.adaptive` finds them due from what :meth:`Scheduler.observe` saw so far.

Admission and KV pressure: a prompt is admitted when no request decodes or more than ``kv_margin`` of the KV
blocks are free, and at least ``min_free_slots`` resident slots are free; prompts are chunked to the budget M; a
token that cannot get a KV block stalls, and only when nothing at all can run is the youngest stalled (or
prefilling) request preempted and recomputed later (its re-prefill produces its next token at full depth).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from cdbsim.errors import ConfigError
from cdbsim.model.arch import ArchSpec
from cdbsim.serving.adaptive import OnlineCosts
from cdbsim.serving.blocks import BlockManager, need_blocks
from cdbsim.serving.config import CoreLaunch, Policy, ServeConfig, padding_table, prefill_graph_sizes
from cdbsim.serving.launch import Launch, SchedulerState, Stage, causal_pairs
from cdbsim.serving.requests import RequestTable, Status
from traces.request import Request

WAITING, PREFILLING, DECODING, FINISHED = Status.WAITING, Status.PREFILLING, Status.DECODING, Status.FINISHED
PREFILL, PRELUDE, CORE, CODA, DECODE = Stage.PREFILL, Stage.PRELUDE, Stage.CORE, Stage.CODA, Stage.DECODE


class Scheduler:
    """Plans launches for ``requests`` (indexed by their position in the list) on ``kv_blocks`` blocks;
    ``share_blocks`` attaches each item's KV block ids to its launch, for a backend that addresses a real cache.

    At most W requests are resident, each with at most one token in flight, so every token queue holds at most
    W tokens and a decode-type launch takes its whole queue. The queues are plain lists handed to the launch
    they feed and replaced, never changed once a launch holds them.
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
        self._loops = config.policy is not Policy.CB        # CDB: tokens carry an exit depth
        self.table = RequestTable(requests, self.r_min, arch.r_max, loops=self._loops)
        self.share_blocks = share_blocks
        self._width = config.width
        self._coda_batch = config.coda_batch
        self._max_coda = config.max_coda_in_flight
        self._budget = config.prefill_budget
        self._admit_slots = config.min_free_slots if config.min_free_slots is not None else max(1, config.width // 8)
        self._pad = padding_table(config.decode_sizes(), config.width)
        self._pad_prefill = padding_table(prefill_graph_sizes(config.prefill_budget), config.prefill_budget)
        self._fill = [config.layout.fill_copies(s, arch.r_max) for s in range(arch.r_max)]
        self._margin_blocks = config.kv_margin * kv_blocks
        self.waiting: deque[int] = deque()
        self.prefilling: list[int] = []
        self.prelude_queue: list[int] = []
        self._prelude_heads: list[int] = []  # of the prelude queue, in its order: tokens that join the core
        self._prelude_tails: list[int] = []  # queue's head (a coda produced them), and those joining its tail
        self.ready: list[int] = []           # refill: tokens waiting for their next core step
        self._ready_steps: list[int] = []    # and that step
        self.coda_queue: list[int] = []
        self.pool: list[int] = []            # cb / norefill: requests with a staged token
        self.stalled: list[tuple[int, bool]] = []  # (request, joins the head) without a KV block
        self._wave: tuple[list[int], list[int], list[int]] | None = None  # norefill: survivors, their step, exited
        self.active = 0
        self.state = SchedulerState()  # as the latest launch left the scheduler (the launch log records it)
        self.decoding = 0
        self.finished = 0
        self.arrived = 0
        self.preemptions = 0
        self.recomputes = 0  # preemptions of decoding requests: their re-prefill produces a token
        self.block_new = False
        self.in_flight = 0
        self.coda_in_flight = 0
        self.launches = 0
        self.done = not requests  # every request has finished and no launch is in flight
        self._retire: dict[int, list[int]] = {}
        self._refill = config.policy in (Policy.REFILL, Policy.ADAPTIVE)  # new tokens go to the prelude queue
        self.costs = OnlineCosts() if config.policy is Policy.ADAPTIVE else None
        self._per_step = config.core_launch is CoreLaunch.PER_STEP
        self._plan_policy = {Policy.CB: self._plan_cb, Policy.NOREFILL: self._plan_norefill,
                             Policy.REFILL: self._plan_refill, Policy.ADAPTIVE: self._plan_adaptive}[config.policy]

    @property
    def blocks(self) -> list[list[int]]:
        """Each request's KV block ids (read-only outside the block manager)."""
        return self.kv.blocks

    def arrive(self, i: int) -> None:
        """Request ``i`` has arrived: it joins the tail of the waiting queue."""
        status = self.table.status
        if status[i] is not Status.NEW:
            raise ValueError(f"request index {i} arrived twice")
        status[i] = WAITING
        self.waiting.append(i)
        self.arrived += 1
        if self.costs is not None:
            self.costs.arrival_rate.arrive(busy=self.in_flight > 0)

    def plan(self) -> Launch | None:
        """The next launch, or None if nothing can run until a launch completes or a request arrives."""
        if self.stalled:
            self._restage_stalled()
        launch = self._plan_policy()
        if launch is None and self.in_flight == 0 and self.finished < self.arrived and self._preempt():
            return self.plan()
        return launch

    def observe(self, launch: Launch, seconds: float) -> None:
        """``launch`` took ``seconds`` on the device: the adaptive policy learns its step costs from it."""
        if self.costs is not None:
            self.costs.observe(launch, seconds)

    def complete(self, launch: Launch) -> list[int]:
        """``launch`` finished on the device; returns the requests it finished (their KV is freed)."""
        self.in_flight -= 1
        if launch.stage is CODA:
            self.coda_in_flight -= 1
        done = self._retire.pop(launch.index, None)
        if done is not None:
            free = self.kv.free
            for i in done:
                free(i)
            self.active -= len(done)
            self.finished += len(done)
            if self.costs is not None:
                output, finish = self.table.output, self.costs.resident_weight.finish
                for i in done:
                    finish(output[i])
            self.block_new = False
        elif self.in_flight:
            return []
        self.done = self.in_flight == 0 and self.finished == len(self.requests)
        return done or []

    def _plan_refill(self) -> Launch | None:
        if self.prelude_queue:
            return self._launch_prelude()
        can_coda = self.coda_in_flight < self._max_coda
        if can_coda and len(self.coda_queue) >= self._coda_batch:
            return self._flush_coda()
        return self._plan_core_first(can_coda)

    def _plan_adaptive(self) -> Launch | None:
        """Refill's order, but the coda (and the prelude right after it) only when the rule finds it due or
        nothing else can run; arrivals wait for their prefill while it is not due and a core step can run."""
        if self.prelude_queue:
            return self._launch_prelude()
        can_coda = self.coda_in_flight < self._max_coda
        if can_coda and self.coda_queue and self.costs.coda_due(  # type: ignore[union-attr]
                len(self.coda_queue), self._ready_steps, len(self.waiting) > self._width - self.active):
            return self._flush_coda()
        if self.ready and self.waiting and not self.prefilling and not self.costs.prefill_due(  # type: ignore[union-attr]
                len(self.waiting), self.active, self._width - self.active):
            return self._launch_core()  # the arrivals gather for one prefill
        return self._plan_core_first(can_coda)

    def _plan_core_first(self, can_coda: bool) -> Launch | None:
        """No boundary stage is due: a prefill, else a core step, else whatever boundary tokens wait."""
        launch = self._try_prefill()
        if launch is not None:
            return launch
        if self.ready:
            return self._launch_core()
        if self.prelude_queue:
            return self._launch_prelude()
        return self._flush_coda() if can_coda and self.coda_queue else None

    def _flush_coda(self) -> Launch:
        batch, self.coda_queue = self.coda_queue, []
        return self._launch_coda(batch)

    def _plan_norefill(self) -> Launch | None:
        if self._wave is not None:
            batch, steps, exited = self._wave
            if batch:
                exits, copies, survivors, survivor_steps = self._loop_step(batch, steps, exited)
                self._wave = (survivors, survivor_steps, exited)
                return self._core_launch(batch, steps, exits, copies)
            if self.coda_in_flight >= self._max_coda:
                return None
            self._wave = None
            return self._launch_coda(exited)
        launch = self._try_prefill()
        if launch is not None or not self.pool:
            return launch
        cohort, self.pool = self.pool, []
        self._wave = (list(cohort), [0] * len(cohort), [])
        position = self.table.position
        return self._decode_launch(PRELUDE, cohort, [position[i] for i in cohort])

    def _plan_cb(self) -> Launch | None:
        launch = self._try_prefill()
        if launch is not None or not self.pool:
            return launch
        batch, self.pool = self.pool, []
        return self._decode_launch(DECODE, batch, self._produce(batch, head=False))

    def _launch_prelude(self) -> Launch:
        batch, self.prelude_queue = self.prelude_queue, []
        heads, tails = self._prelude_heads, self._prelude_tails
        if heads or tails:  # they join the core queue at step 0
            self.ready = heads + self.ready + tails
            self._ready_steps = [0] * len(heads) + self._ready_steps + [0] * len(tails)
            self._prelude_heads, self._prelude_tails = [], []
        position = self.table.position
        return self._decode_launch(PRELUDE, batch, [position[i] for i in batch])

    def _launch_core(self) -> Launch:
        batch, steps = self.ready, self._ready_steps
        deferred: list[int] = []
        deferred_steps: list[int] = []
        if self._per_step and min(steps) != max(steps):  # only the tokens at the head token's loop step
            head = steps[0]
            deferred = [i for i, s in zip(batch, steps, strict=True) if s != head]
            deferred_steps = [s for s in steps if s != head]
            batch = [i for i, s in zip(batch, steps, strict=True) if s == head]
            steps = [head] * len(batch)
        exits, copies, self.ready, self._ready_steps = self._loop_step(batch, steps, self.coda_queue)
        if deferred:  # survivors first, then the tokens at other steps, each in queue order
            self.ready += deferred
            self._ready_steps += deferred_steps
        return self._core_launch(batch, steps, exits, copies)

    def _launch_coda(self, batch: list[int]) -> Launch:
        self.coda_in_flight += 1
        return self._decode_launch(CODA, batch, self._produce(batch, head=True))

    def _loop_step(self, batch: list[int], steps: list[int], exited: list[int]) -> tuple[list[bool], int, list[int],
                                                                                           list[int]]:
        """One core step over ``batch`` (at loop ``steps``): tokens at their exit step go to ``exited``. Returns each
        item's exit flag, the KV fill copies of the exits, and the tokens that loop again with their next step."""
        last, fill = self.table.last, self._fill
        exits: list[bool] = []
        survivors: list[int] = []
        survivor_steps: list[int] = []
        copies = 0
        # indexed lists and direct appends, not zip and bound methods: compiled, these are native list operations
        for k in range(len(batch)):
            i, s = batch[k], steps[k]
            if s >= last[i]:
                exits.append(True)
                exited.append(i)
                copies += fill[s]
            else:
                exits.append(False)
                survivors.append(i)
                survivor_steps.append(s + 1)
        return exits, copies, survivors, survivor_steps

    def _try_prefill(self) -> Launch | None:
        """Admit and pack prompt chunks up to the budget M, or None (see the module docstring)."""
        free_slots = self._width - self.active
        fresh = 0 if self.block_new else min(free_slots, len(self.waiting))
        if not self.prefilling and (fresh == 0 or free_slots < self._admit_slots):
            return None
        kv = self.kv
        if self.decoding and kv.total - kv.used <= self._margin_blocks:
            return None
        table = self.table
        status, prefilled, target = table.status, table.prefilled, table.prefill_target
        budget = self._budget
        requests: list[int] = []
        starts: list[int] = []
        lens: list[int] = []
        finishes: list[bool] = []
        taken_fresh = [self.waiting.popleft() for _ in range(fresh)]
        skipped: list[int] = []
        for i in self.prefilling + taken_fresh:
            done = prefilled[i]
            chunk = min(target[i] - done, budget)
            if budget == 0 or (requests and kv.total - kv.used < self._margin_blocks) or not kv.allocate(
                    i, done + chunk):
                if status[i] is WAITING:
                    skipped.append(i)
                continue
            if status[i] is WAITING:
                status[i] = PREFILLING
                self.active += 1
                self.prefilling.append(i)
            requests.append(i)
            starts.append(done)
            lens.append(chunk)
            prefilled[i] = done + chunk
            budget -= chunk
            finishes.append(done + chunk == target[i])
        self.waiting.extendleft(reversed(skipped))
        if not requests:
            return None
        recomputed = [target[i] - table.prompt[i] for i in requests] if self.share_blocks else ()
        prefilled_all = [i for i, final in zip(requests, finishes, strict=True) if final]
        for i in prefilled_all:
            self.prefilling.remove(i)
            status[i] = DECODING
        self.decoding += len(prefilled_all)
        self._produce(prefilled_all, head=False)
        tokens = sum(lens)
        context = sum(causal_pairs(c, s) for s, c in zip(starts, lens, strict=True))
        launch = self._emit(PREFILL, requests, starts, (), (), lens, finishes, tokens, self._pad_prefill[tokens],
                            context, 0, 0)
        launch.recomputed = recomputed
        return launch

    def _produce(self, batch: list[int], head: bool) -> list[int]:
        """Each request in ``batch`` produced a token in the launch being planned: finish it (its KV is freed when
        that launch completes), or stage its next token. Returns the input tokens' positions."""
        table = self.table
        position, final, status = table.position, table.final, table.status
        kv = self.kv
        capacity = kv.capacity
        positions = [position[i] for i in batch]
        staged: list[int] = []
        retire: list[int] = []
        loops, last, exit_steps, base = self._loops, table.last, table.exit_steps, table.exit_base
        for k in range(len(batch)):
            i = batch[k]
            p = positions[k] + 1
            position[i] = p
            if p >= final[i]:
                status[i] = FINISHED
                retire.append(i)
            elif p < capacity[i] or kv.allocate(i, p + 1):
                staged.append(i)
                if loops:  # the token's exit step (RequestTable.start_token)
                    last[i] = exit_steps[base[i] + p]
            else:
                self.stalled.append((i, head))
        if retire:
            self._retire[self.launches] = retire
            self.decoding -= len(retire)
        self._enqueue(staged, head)
        return positions

    def _enqueue(self, staged: list[int], head: bool) -> None:
        """Tokens that can run: to the prelude queue (refill) or the pool of staged requests."""
        if self._refill:
            self.prelude_queue += staged
            if head:
                self._prelude_heads += staged
            else:
                self._prelude_tails += staged
        else:
            self.pool += staged

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

    def _decode_launch(self, stage: Stage, batch: list[int], positions: list[int], steps: Sequence[int] = (),
                       exits: Sequence[bool] = (), copies: int = 0) -> Launch:
        n = len(batch)
        return self._emit(stage, batch, positions, steps, exits, (), (), n, self._pad[n], sum(positions) + n,
                          max(positions) + 1, copies)

    def _core_launch(self, batch: list[int], steps: list[int], exits: list[bool], copies: int) -> Launch:
        position = self.table.position
        return self._decode_launch(CORE, batch, [position[i] for i in batch], steps, exits, copies)

    def _emit(self, stage: Stage, requests: list[int], positions: list[int], steps: Sequence[int],
              exits: Sequence[bool], chunk_lens: Sequence[int], finishes: Sequence[bool], size: int, padded: int,
              context: int, longest: int, copies: int) -> Launch:
        """The launch; :attr:`state` becomes the scheduler's state as it leaves (queues, residents, KV in use)."""
        if self._refill:
            core, coda = len(self.ready), len(self.coda_queue)
        elif self._wave is not None:
            core, coda = len(self._wave[0]), len(self._wave[2])
        else:
            core, coda = len(self.pool), len(self.coda_queue)
        kv = self.kv
        blocks, dropped = ([kv.blocks[i] for i in requests], kv.take_dropped()) if self.share_blocks else (None, ())
        launch = Launch(self.launches, stage, requests, positions, steps, exits, chunk_lens, finishes, size, padded,
                        context, longest, copies, blocks, (), dropped)
        self.state = SchedulerState(len(self.waiting), core, coda, self.active, kv.used)
        self.launches += 1
        self.in_flight += 1
        self.done = False
        return launch
