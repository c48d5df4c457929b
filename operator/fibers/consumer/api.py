"""What a DatabusConsumer callback codes against: the stable, supported surface of the consumer.

A callback (`spec.sink.type: callback`, "package.module:Class") subclasses `Callback`, or `WindowSink`
to be handed complete windows once per batch, and returns a `Result` from each method; the events it
receives are `ChangeEvent`s. `Feeder` and `change` test a callback without Kafka, as a pod would drive
it. Everything else under `fibers.consumer` is the pod's own and may change between releases.
"""

from fibers.consumer.callbacks import Callback, Result, WindowSink
from fibers.consumer.events import ChangeEvent
from fibers.consumer.testing import Feeder, change

__all__ = ["Callback", "ChangeEvent", "Feeder", "Result", "WindowSink", "change"]
