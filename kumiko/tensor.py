from kumiko.frontend.tensor import Tensor  # noqa: F401
