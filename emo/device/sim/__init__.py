"""The virtual GPU: a discrete-event simulator of GPUs, their streams, host threads and links,
implementing the device protocol (emo.device.Device). See docs/design.md §11."""

from emo.device.sim.device import SimDevice
from emo.device.sim.physics import SimPhysics

__all__ = ["SimDevice", "SimPhysics"]
