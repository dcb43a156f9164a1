"""Image classification, the parts every suite that trains or reads a ViT classifier shares (torch-free at import;
each module is imported on use):

- :mod:`.data`: the readers (scikit-learn's digits, CIFAR's python release, an ImageFolder such as an ImageNet
  subset), their train / val / test splits and transforms (DeiT's augmentation from timm, posterize guarded).
- :mod:`.classify`: the ViT classifier of a preset, its data, the recipe's loss (timm's label smoothing, mixup /
  cutmix), evaluation (top-1, top-5), FLOPs, throughput and memory, and :func:`~.classify.fit_classifier`, which
  trains and tests one classifier.
- :mod:`.teacher`: the trained softmax ViT that linearisation pipelines start from.
- :mod:`.smoke`: a preset's data written in its real format and the shortened preset of a smoke run.

A *preset* here is any object with the fields of :class:`.classify.ClassifierPreset` (``data``, ``model``,
``recipe``, ``train``, ``sweep``, ``key``, ``identity_hash()``, ``options_for()``).
"""
