"""mixrt.gluon.model_zoo: MXNet 1.x's Gluon model zoo (``vision``), the same blocks,
parameter names and shapes, built untrained (pretrained weights are read from local files
only, see ``model_store``)."""

from mixrt.gluon.model_zoo import model_store, vision
from mixrt.gluon.model_zoo.vision import get_model

__all__ = ["get_model", "model_store", "vision"]
