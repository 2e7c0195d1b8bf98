"""The embedded simulated phone: the default gym (``gym id: sim``)."""

from cua_native.gym.sim.gym import SimExecution, SimGym, UnknownTask
from cua_native.gym.sim.solver import SwipeStyle, next_step
from cua_native.gym.sim.tasks import catalogue

__all__ = ["SimExecution", "SimGym", "SwipeStyle", "UnknownTask", "catalogue", "next_step"]
