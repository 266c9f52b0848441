"""The daemon's parts wired from a built core: one pure function, ``wire``, that makes
every part and starts none (``Daemon`` starts them, in one order, and stops them in the
reverse)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from .access import StoreAccess
from .agent import Dispatcher, TurnRunner
from .agent.calls import CallExecutor
from .brains.base import Brain, BrainContext
from .brains.rules import RulesBrain
from .bus import Bus
from .cluster import Cluster
from .config import Config, llm_enabled
from .core import Core
from .delivery import DeliveryWorker
from .events import MessageInbound, OutboundKind, OutboundMessage
from .housekeeping import Housekeeping
from .instances import InstanceMembership, default_name
from .media.budget import MediaBudget
from .media.inbound import MediaPreparer, Transcribe
from .media.inbox import INBOX
from .previews import Previews
from .scheduling.scheduler import Scheduler
from .store import BusQueues

# With several daemons on one store: how often reminders set elsewhere are looked for.
SCHEDULE_RESYNC = 15.0

Close = Callable[[], Awaitable[None]]


@dataclass
class Runtime:
    """Every part of one run, made and not started."""

    bus: Bus
    cluster: Cluster | None  # only on a shared store (several daemons)
    membership: InstanceMembership
    executor: CallExecutor
    brain: Brain
    media: MediaPreparer
    previews: Previews
    runner: TurnRunner
    delivery: DeliveryWorker
    dispatcher: Dispatcher
    scheduler: Scheduler
    access: StoreAccess
    housekeeping: Housekeeping
    # The brain's and the transcriber's HTTP clients, by name: closed at stop.
    clients: dict[str, Close] = field(default_factory=dict)


def wire(
    core: Core,
    environ: Mapping[str, str],
    *,
    started_at: float,
    brain: Brain | None = None,
) -> Runtime:
    """Make the daemon's parts from ``core`` (``brain`` replaces the configured one)."""
    config = core.loaded.config
    store = core.store
    clients: dict[str, Close] = {}
    membership = InstanceMembership(
        store, label=config.bot.instance or default_name(), started_at=started_at
    )
    cluster = Cluster(store, membership.name, label=membership.label) if store.shared else None
    fence = cluster.fence if cluster is not None else None
    queues = BusQueues(store)
    bus = Bus(queues, queues)
    executor = CallExecutor(
        store=store,
        registry=core.registry,
        gate=core.gate,
        live=core.live,
        masker=core.masker,
        fence=fence,
    )
    brain = brain or _brain(core, environ, bus, clients)
    inbox_dir = core.workspace / INBOX
    budget = MediaBudget(
        inbox_dir,
        daily_per_sender=config.media.daily_bytes_per_sender,
        inbox_max=config.media.inbox_max,
    )

    async def approver(message: MessageInbound) -> bool:  # exempt from the daily budget
        directory = core.live.current.directory
        return await store.run(
            lambda tx: directory.is_approver(tx, message.address, message.sender.id)
        )

    media = MediaPreparer(
        core.workspace,
        transcribe=_transcriber(config, environ, clients),
        budget=budget,
        exempt=approver,
    )
    previews = Previews(core.masker)
    runner = TurnRunner(
        store=store,
        brain=brain,
        commands=core.commands,
        registry=core.registry,
        exposed=lambda: core.exposed,
        executor=executor,
        media=media,
        previews=previews,
        fence=fence,
        masker=core.masker,
        config=config.brain,
    )
    return Runtime(
        bus=bus,
        cluster=cluster,
        membership=membership,
        executor=executor,
        brain=brain,
        media=media,
        previews=previews,
        runner=runner,
        # Both subscribe to the store: new inbound runs, queued outbound is sent.
        delivery=DeliveryWorker(store=store, masker=core.masker, cluster=cluster),
        dispatcher=Dispatcher(
            store=store,
            runner=runner,
            gate=core.gate,
            max_concurrent=config.bot.max_concurrent_turns,
            cluster=cluster,
        ),
        scheduler=Scheduler(
            store,
            bus,
            cron_jobs=config.cron,
            timezone=config.bot.timezone,
            grace=config.scheduler.grace,
            resync=SCHEDULE_RESYNC if cluster is not None else None,
        ),
        access=StoreAccess(store, config),
        housekeeping=Housekeeping(
            store, retention=config.storage.retention.total_seconds(), inbox=inbox_dir
        ),
        clients=clients,
    )


def _brain(core: Core, environ: Mapping[str, str], bus: Bus, clients: dict[str, Close]) -> Brain:
    """The rules brain; with a model configured, the model first and rules when it fails."""
    rules = RulesBrain(core.commands)
    config = core.loaded.config
    if not llm_enabled(core.loaded, environ):
        return rules
    from .brains.openai_brain import OpenAIBrain
    from .brains.routed import RoutedBrain

    llm = OpenAIBrain(config.openai, config.brain, environ.get(config.openai.api_key_env))
    clients["the model's client"] = llm.close

    async def usage_since(ts: float) -> int:
        return await core.store.run(lambda tx: tx.audit.tokens_since(ts), slow=True)

    async def notify(text: str, context: BrainContext) -> None:
        to = core.live.current.directory.default_chat or context.origin
        await bus.send(OutboundMessage(to=to, text=text, kind=OutboundKind.NOTICE))

    return RoutedBrain(
        llm,
        rules,
        fallback_after=config.brain.fallback_after,
        probe_interval=config.brain.probe_interval.total_seconds(),
        daily_token_budget=config.openai.daily_token_budget,
        usage_since=usage_since,
        notify=notify,
        timezone=config.bot.timezone,
    )


def _transcriber(
    config: Config, environ: Mapping[str, str], clients: dict[str, Close]
) -> Transcribe | None:
    openai = config.openai
    if openai.transcription_model is None:
        return None
    from .media.transcribe import Transcriber

    transcriber = Transcriber(openai, environ.get(openai.api_key_env))
    clients["the transcription client"] = transcriber.close
    return transcriber


def brain_label(brain: Brain, config: Config) -> str:
    """The brain in the words ``check-config`` uses: ``llm (MODEL)`` (the model first,
    rules when it fails) or ``rules``."""
    if brain.name in {"openai", "routed"}:
        return f"llm ({config.openai.model})"
    return brain.name
