"""One file per mechanism; importing this package registers them all."""

from . import base  # noqa: F401
from . import linear, relu_linear, softmax  # noqa: F401
from . import flatten, laplacian, mirrorla, nala, polaformer, relu_quadratic, stella  # noqa: F401
from . import cosformer, hedgehog, linformer, nystromformer, performer, skyformer  # noqa: F401
from . import silu  # noqa: F401  (a feature map only: the LM layers' baseline)
