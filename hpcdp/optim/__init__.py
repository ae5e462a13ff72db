"""Optimizers and their parameter groups, in plain PyTorch, for any model.

- `groups`: which parameters are decayed and which take a layer-wise trust ratio,
  read from the module types and the parameters' shapes (any torch model);
- `lars`, `lamb`: the large-batch optimizers of You et al. (2017, 2019), on the
  per-tensor loop of `layerwise`;
- `build`: the one builder of the optimizer [optim] names, shared by every task.

A layer between the tasks and the base: it imports torch and hpcdp.config only.
"""
