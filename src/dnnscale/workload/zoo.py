"""Built-in workloads. Each builder's docstring gives its source and what was assumed.

Names: adam-mnist, adam-cifar10, adam-imagenet22k, alexnet, vgg16, resnet50, mlp, and the transformers of
workload/transformer_zoo.py (gpt3-*, llama2-*, llama3-*, bert-large, and the mixtures of experts
mixtral-8x7b, mixtral-8x22b, deepseek-v3-like). alexnet, vgg16 and resnet50 take their
activations' layout: ``resnet50:layout=nchw`` (default nhwc, channels last; conv2d's
`layout`) and whether their ReLUs (and resnet50's adds) run in place (``vgg16:inplace=false``:
each with its own buffer; INPLACE_CHOICES); resnet50 also the batch-norm fusions its framework
runs: ``resnet50:fuse_bn=all`` (RESNET_BN_FUSIONS); several arguments joined by commas.
`mlp` takes widths in its name: ``mlp:784-1024-1024-10`` (input width first, classes last);
`gpt` takes its shape: ``gpt:layers=24,hidden=1024,heads=16,seq=1024,vocab=51200``
(``experts=8,top_k=2`` more for a mixture of experts).
"""

from __future__ import annotations

from collections.abc import Callable

from dnnscale.errors import InputError, short_repr
from dnnscale.workload.kinds import CONV_KINDS, CONV_LAYOUTS
from dnnscale.workload.transformer_zoo import TRANSFORMER_ZOO, gpt_from_name
from dnnscale.workload.workload import Workload, build_workload

ZOO: dict[str, Callable[..., Workload]] = {}
# Names that take an argument after ':' and how to read it (`mlp` is handled below).
PARAMETRIC: dict[str, Callable[[str], Workload]] = {"gpt": gpt_from_name}


def register_workload(name: str) -> Callable[[Callable[..., Workload]], Callable[..., Workload]]:
    def decorate(builder: Callable[..., Workload]) -> Callable[..., Workload]:
        ZOO[name] = builder
        return builder

    return decorate


def _conv_block(name: str, out_channels: int, kernel: int, stride: int = 1, padding: int = 0,
                pool: tuple[str, int, int] | None = None) -> list[dict[str, object]]:
    block: list[dict[str, object]] = [
        {"kind": "conv2d", "name": name, "out_channels": out_channels, "kernel": kernel,
         "stride": stride, "padding": padding},
        {"kind": "relu", "name": f"{name}_relu"},
    ]
    if pool is not None:
        kind, size, pool_stride = pool
        block.append({"kind": kind, "name": f"{name}_pool", "kernel": size, "stride": pool_stride})
    return block


def _fc_block(name: str, out_features: int, last: bool = False) -> list[dict[str, object]]:
    if last:
        return [{"kind": "linear", "name": name, "out_features": out_features},
                {"kind": "softmax_loss", "name": "loss"}]
    return [{"kind": "linear", "name": name, "out_features": out_features},
            {"kind": "relu", "name": f"{name}_relu"}]


RESNET_BN_FUSIONS = ("none", "relu", "all")
"""What resnet50's batch norms run in their own kernels (its `fuse_bn` argument): nothing more
(the default: PyTorch eager, TensorFlow without XLA), the ReLU after each norm that has one
('relu': MXNet's --fuse-bn-relu), or that and each block's add and final ReLU in the block's
last norm ('all': --fuse-bn-relu and --fuse-bn-add-relu, which DeepLearningExamples' MXNet
runner passes for float16). batchnorm2d's `fuse` prices it (workload/kinds.py)."""

INPLACE_CHOICES = ("true", "false")
"""Whether alexnet's, vgg16's and resnet50's ReLUs and residual adds write over their input (their
`inplace` argument): 'true', as torchvision runs them (nn.ReLU(inplace=True) in all three,
`out += residual` in ResNet's bottleneck; DeepLearningExamples' resnet.py the same), the
default; 'false' for a framework that gives each its own output buffer. Memory only: the bytes
moved are the same (Layer.kept_values)."""
IN_PLACE_KINDS = ("relu", "shortcut_add")
"""The kinds `inplace` marks (workload/kinds.py: each takes `inplace`)."""

ZOO_ARGUMENTS = {"alexnet": {"layout": CONV_LAYOUTS, "inplace": INPLACE_CHOICES},
                 "vgg16": {"layout": CONV_LAYOUTS, "inplace": INPLACE_CHOICES},
                 "resnet50": {"layout": CONV_LAYOUTS, "fuse_bn": RESNET_BN_FUSIONS,
                              "inplace": INPLACE_CHOICES}}
"""The zoo's convolutional networks and the key=value arguments each takes after ':'
(``resnet50:layout=nchw,fuse_bn=all``), with their values; the first value of each is the
default."""


def _laid_out(specs: list[dict[str, object]], layout: str) -> list[dict[str, object]]:
    """`specs` with every convolution in `layout` (the default, nhwc, is left unwritten)."""
    if layout == "nhwc":
        return specs
    return [{**spec, "layout": layout} if spec["kind"] in CONV_KINDS else spec
            for spec in specs]


def _in_place(specs: list[dict[str, object]], inplace: str, base: str
              ) -> list[dict[str, object]]:
    """`specs` with every ReLU and residual add writing over its input where `inplace` is
    'true' (INPLACE_CHOICES); InputError naming the workload for another value."""
    if inplace not in INPLACE_CHOICES:
        raise InputError("workload", f"{base}'s inplace must be one of "
                         f"{', '.join(INPLACE_CHOICES)}, got {short_repr(inplace)}")
    if inplace == "false":
        return specs
    return [{**spec, "inplace": True} if spec["kind"] in IN_PLACE_KINDS else spec
            for spec in specs]


def zoo_name(base: str, **arguments: str) -> str:
    """The zoo name of ZOO_ARGUMENTS' network `base` built with `arguments`: `base` with those
    that are not their defaults, in ZOO_ARGUMENTS' order (``resnet50:layout=nchw,fuse_bn=all``);
    `zoo_workload` reads it back."""
    written = [f"{key}={arguments[key]}" for key, values in ZOO_ARGUMENTS[base].items()
               if arguments.get(key, values[0]) != values[0]]
    return f"{base}:{','.join(written)}" if written else base


def _zoo_arguments(base: str, name: str, argument: str) -> dict[str, str]:
    """The key=value arguments of a convolutional network's name, each checked against
    ZOO_ARGUMENTS; InputError naming the name otherwise."""
    allowed = ZOO_ARGUMENTS[base]
    usage = " and ".join(f"{key}={'|'.join(values)}" for key, values in allowed.items())
    parsed: dict[str, str] = {}
    for part in argument.split(","):
        key, equals, value = (text.strip() for text in part.partition("="))
        if not equals or key not in allowed or value not in allowed[key] or key in parsed:
            raise InputError("workload", f"{base} takes {usage} after ':' (comma-separated), "
                             f"got {short_repr(name)}")
        parsed[key] = value
    return parsed


@register_workload("adam-mnist")
def adam_mnist() -> Workload:
    """Project Adam's MNIST benchmark (Chilimbi et al., OSDI 2014), reconstructed.

    The exact network is not published in any source we have. Assumed: a LeNet-style CNN on
    1x28x28 digits: conv 5x5 1->32 (pad 2) + ReLU + 2x2 max-pool, conv 5x5 32->64 (pad 2) + ReLU +
    2x2 max-pool, FC 3136->1024 + ReLU, FC 1024->10 + softmax. 60,000 training images.
    """
    specs = (_conv_block("conv1", 32, 5, padding=2, pool=("maxpool2d", 2, 2))
             + _conv_block("conv2", 64, 5, padding=2, pool=("maxpool2d", 2, 2))
             + [{"kind": "flatten", "name": "flatten"}]
             + _fc_block("fc1", 1024) + _fc_block("fc2", 10, last=True))
    return build_workload("adam-mnist", [1, 28, 28], specs, samples_per_epoch=60_000,
                          description=adam_mnist.__doc__ or "")


@register_workload("adam-cifar10")
def adam_cifar10() -> Workload:
    """Project Adam's CIFAR-10 benchmark (also used by Yan et al., KDD 2015), reconstructed.

    The exact network is not published in any source we have. Assumed: a cuda-convnet-style CNN
    on 3x32x32 images: conv 5x5 3->64 (pad 2), conv 5x5 64->64 (pad 2), conv 3x3 64->128 (pad 1),
    each + ReLU + 3x3/2 max-pool (32->15->7->3), FC 1152->512 + ReLU, FC 512->10 + softmax.
    About 0.78 M parameters and 32 M forward multiply-adds per image. 50,000 training images.
    """
    specs = (_conv_block("conv1", 64, 5, padding=2, pool=("maxpool2d", 3, 2))
             + _conv_block("conv2", 64, 5, padding=2, pool=("maxpool2d", 3, 2))
             + _conv_block("conv3", 128, 3, padding=1, pool=("maxpool2d", 3, 2))
             + [{"kind": "flatten", "name": "flatten"}]
             + _fc_block("fc1", 512) + _fc_block("fc2", 10, last=True))
    return build_workload("adam-cifar10", [3, 32, 32], specs, samples_per_epoch=50_000,
                          description=adam_cifar10.__doc__ or "")


@register_workload("adam-imagenet22k")
def adam_imagenet22k(width: float = 1.0, image_size: int = 224) -> Workload:
    """Project Adam's ImageNet-22K benchmark (OSDI 2014; Yan et al., KDD 2015), reconstructed.

    Known: 5 convolutional + 3 fully connected layers, a 22,000-way output, about 2 billion
    connections (forward multiply-adds per image), ~14 M training images (ImageNet-22K holds
    14,197,122). Assumed: an AlexNet-shaped network on 3x224x224 crops, widened until it reaches
    2 billion connections: conv 11x11/4 3->128 (pad 2) + 3x3/2 max-pool, conv 5x5 128->336
    (pad 2) + max-pool, conv 3x3 336->512, 512->512, 512->320 (pad 1) + max-pool, FC
    11520->4096, 4096->4096, 4096->22000 + softmax; ReLU after every conv and hidden FC.
    Result: 1.99e9 multiply-adds and 160.6 M parameters per the formulas in workload/kinds.py.

    `width` scales every hidden layer's channels/features (the 22,000 classes stay unless
    width < 1, when they scale too) and `image_size` the input crop: the validation issue trains
    a scaled-down copy with the same layer structure.
    """

    def w(value: int) -> int:
        return max(1, round(value * width))

    classes = 22_000 if width >= 1 else w(22_000)
    specs = (_conv_block("conv1", w(128), 11, stride=4, padding=2, pool=("maxpool2d", 3, 2))
             + _conv_block("conv2", w(336), 5, padding=2, pool=("maxpool2d", 3, 2))
             + _conv_block("conv3", w(512), 3, padding=1)
             + _conv_block("conv4", w(512), 3, padding=1)
             + _conv_block("conv5", w(320), 3, padding=1, pool=("maxpool2d", 3, 2))
             + [{"kind": "flatten", "name": "flatten"}]
             + _fc_block("fc1", w(4096)) + _fc_block("fc2", w(4096))
             + _fc_block("fc3", classes, last=True))
    name = "adam-imagenet22k" if (width, image_size) == (1.0, 224) else \
        f"adam-imagenet22k(width={width:g},image={image_size})"
    return build_workload(name, [3, image_size, image_size], specs,
                          samples_per_epoch=14_197_122, description=adam_imagenet22k.__doc__ or "")


@register_workload("alexnet")
def alexnet(layout: str = "nhwc", inplace: str = "true") -> Workload:
    """AlexNet (Krizhevsky et al., 2012) in torchvision's single-tower form.

    3x224x224 input; conv 11x11/4 3->64 (pad 2), 5x5 64->192 (pad 2), 3x3 192->384, 384->256,
    256->256 (pad 1), 3x3/2 max-pools after conv1, conv2, conv5; FC 9216->4096->4096->1000.
    Dropout is omitted (no FLOPs). ImageNet-1k: 1,281,167 training images. Its ReLUs run in
    place unless `inplace` is 'false' (INPLACE_CHOICES).
    """
    specs = (_conv_block("conv1", 64, 11, stride=4, padding=2, pool=("maxpool2d", 3, 2))
             + _conv_block("conv2", 192, 5, padding=2, pool=("maxpool2d", 3, 2))
             + _conv_block("conv3", 384, 3, padding=1)
             + _conv_block("conv4", 256, 3, padding=1)
             + _conv_block("conv5", 256, 3, padding=1, pool=("maxpool2d", 3, 2))
             + [{"kind": "flatten", "name": "flatten"}]
             + _fc_block("fc1", 4096) + _fc_block("fc2", 4096) + _fc_block("fc3", 1000, last=True))
    return build_workload(zoo_name("alexnet", layout=layout, inplace=inplace), [3, 224, 224],
                          _laid_out(_in_place(specs, inplace, "alexnet"), layout),
                          samples_per_epoch=1_281_167,
                          description=alexnet.__doc__ or "")


@register_workload("vgg16")
def vgg16(layout: str = "nhwc", inplace: str = "true") -> Workload:
    """VGG-16, configuration D (Simonyan & Zisserman, 2015), as in torchvision without dropout.

    Thirteen 3x3 convolutions (pad 1) in five blocks of 64, 128, 256, 512, 512 channels, each
    block closed by a 2x2 max-pool; FC 25088->4096->4096->1000. ImageNet-1k: 1,281,167 images.
    Its ReLUs run in place unless `inplace` is 'false' (INPLACE_CHOICES).
    """
    specs: list[dict[str, object]] = []
    blocks = [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    for block_index, (channels, repeats) in enumerate(blocks, start=1):
        for conv_index in range(1, repeats + 1):
            pool = ("maxpool2d", 2, 2) if conv_index == repeats else None
            specs += _conv_block(f"conv{block_index}_{conv_index}", channels, 3, padding=1,
                                 pool=pool)
    specs += ([{"kind": "flatten", "name": "flatten"}] + _fc_block("fc1", 4096)
              + _fc_block("fc2", 4096) + _fc_block("fc3", 1000, last=True))
    return build_workload(zoo_name("vgg16", layout=layout, inplace=inplace), [3, 224, 224],
                          _laid_out(_in_place(specs, inplace, "vgg16"), layout),
                          samples_per_epoch=1_281_167,
                          description=vgg16.__doc__ or "")


RESNET50_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
"""ResNet-50's four stages: (bottleneck width, blocks, stride of the first block); each block's
output has 4 x its width (He et al. 2016, Table 1, "50-layer")."""
IMAGENET_TRAIN_IMAGES = 1_281_167


def _conv_bn(name: str, out_channels: int, kernel: int, stride: int = 1,
             relu: bool = True, fuse_bn: str = "none") -> list[dict[str, object]]:
    """A bias-free convolution (padding kernel // 2), its batch norm, and a ReLU unless not:
    a layer of its own, or run by the norm where `fuse_bn` fuses it (RESNET_BN_FUSIONS)."""
    fused = relu and fuse_bn != "none"
    specs: list[dict[str, object]] = [
        {"kind": "conv2d", "name": name, "out_channels": out_channels, "kernel": kernel,
         "stride": stride, "padding": kernel // 2, "bias": False},
        {"kind": "batchnorm2d", "name": f"{name}_bn", **({"fuse": "relu"} if fused else {})}]
    return specs + ([{"kind": "relu", "name": f"{name}_relu"}] if relu and not fused else [])


def _bottleneck(name: str, block_input: tuple[int, int, int], width: int,
                stride: int, fuse_bn: str = "none"
                ) -> tuple[list[dict[str, object]], tuple[int, int, int]]:
    """One v1.5 bottleneck on `block_input` (C, H, W): 1x1 to `width`, 3x3 with the stride,
    1x1 to 4·width, each with batch norm; a projection shortcut (1x1 with the stride, batch
    norm) where the shape changes; the add; ReLU. With `fuse_bn` 'all' the last norm runs the
    add and the ReLU (fuse: add_relu; MXNet's BatchNormAddRelu on the main branch, the
    shortcut's norm apart); a fused add's sum is the norm's own output, so it keeps no buffer
    of its own (`inplace`). Returns its specs and its output shape."""
    channels, height, width_px = block_input
    out = (4 * width, (height - 1) // stride + 1, (width_px - 1) // stride + 1)
    add_relu = fuse_bn == "all"
    specs = (_conv_bn(f"{name}.conv1", width, 1, fuse_bn=fuse_bn)
             + _conv_bn(f"{name}.conv2", width, 3, stride, fuse_bn=fuse_bn)
             + _conv_bn(f"{name}.conv3", 4 * width, 1, relu=False))
    if add_relu:
        specs[-1] = {**specs[-1], "fuse": "add_relu"}
    projection = out[0] != channels or stride != 1
    if projection:
        specs += [{"kind": "shortcut_conv2d", "name": f"{name}.shortcut",
                   "block_input": list(block_input), "stride": stride},
                  {"kind": "batchnorm2d", "name": f"{name}.shortcut_bn"}]
    specs.append({"kind": "shortcut_add", "name": f"{name}.add", "identity": not projection,
                  **({"fused": True, "inplace": True} if add_relu else {})})
    if not add_relu:
        specs.append({"kind": "relu", "name": f"{name}.relu"})
    return specs, out


@register_workload("resnet50")
def resnet50(layout: str = "nhwc", fuse_bn: str = "none", inplace: str = "true") -> Workload:
    """ResNet-50 v1.5 (He et al. 2016, Table 1's 50-layer network, with the stride-2 of each
    downsampling bottleneck on its 3x3 convolution instead of the first 1x1: NVIDIA
    DeepLearningExamples' resnet50v1.5 README, torchvision's resnet50).

    3x224x224 input; conv 7x7/2 3->64 (pad 3) + batch norm + ReLU + 3x3/2 max-pool (pad 1) to
    64x56x56; bottleneck stages RESNET50_STAGES (3, 4, 6, 3 blocks of width 64, 128, 256, 512,
    outputs 256x56x56, 512x28x28, 1024x14x14, 2048x7x7); 7x7 average pool (the global pool at
    224), FC 2048->1000 + softmax. Convolutions have no bias (each is followed by a batch
    norm); the shortcuts are identities but for the first block of each stage, a 1x1
    projection with the stage's stride (option B). The residual branches lie beside the chain
    (shortcut_conv2d, shortcut_add in workload/kinds.py).

    Checked (tests/test_resnet50.py): 25,557,032 parameters, torchvision's num_params for
    resnet50; 4.09 G forward multiply-adds per image (conv and FC), torchvision's "GFLOPS 4.09"
    for it (a multiply-add counted once). He et al.'s 3.8 G is v1's (stride on the 1x1).
    ImageNet-1k: 1,281,167 training images.

    `fuse_bn` (RESNET_BN_FUSIONS): which ReLUs and adds run inside the batch norms' kernels;
    the parameters and FLOPs do not change, only the bytes moved and the kernels launched.
    `inplace` (INPLACE_CHOICES): whether the ReLUs and adds write over their input, which
    changes only what the activations keep (Layer.kept_values).
    """
    if fuse_bn not in RESNET_BN_FUSIONS:
        raise InputError("workload", f"resnet50's fuse_bn must be one of "
                         f"{', '.join(RESNET_BN_FUSIONS)}, got {short_repr(fuse_bn)}")
    specs = (_conv_bn("conv1", 64, 7, 2, fuse_bn=fuse_bn)
             + [{"kind": "maxpool2d", "name": "maxpool", "kernel": 3, "stride": 2,
                 "padding": 1}])
    shape = (64, 56, 56)
    for stage, (width, blocks, stride) in enumerate(RESNET50_STAGES, start=1):
        for block in range(blocks):
            block_specs, shape = _bottleneck(f"layer{stage}.{block}", shape, width,
                                             stride if block == 0 else 1, fuse_bn)
            specs += block_specs
    specs += [{"kind": "avgpool2d", "name": "avgpool", "kernel": shape[1]},
              {"kind": "flatten", "name": "flatten"}] + _fc_block("fc", 1000, last=True)
    return build_workload(zoo_name("resnet50", layout=layout, fuse_bn=fuse_bn, inplace=inplace),
                          [3, 224, 224],
                          _laid_out(_in_place(specs, inplace, "resnet50"), layout),
                          samples_per_epoch=IMAGENET_TRAIN_IMAGES,
                          description=resnet50.__doc__ or "")


@register_workload("mlp")
def mlp(widths: tuple[int, ...] = (784, 1024, 1024, 10), samples_per_epoch: int = 60_000) -> Workload:
    """A multi-layer perceptron: widths[0] inputs, ReLU hidden layers, widths[-1]-way softmax.

    Default 784-1024-1024-10 (MNIST-sized). Choose widths with the name ``mlp:784-512-10``.
    """
    if len(widths) < 2:
        raise InputError("workload", "an mlp needs at least an input and an output width")
    specs: list[dict[str, object]] = []
    for index, width in enumerate(widths[1:], start=1):
        specs += _fc_block(f"fc{index}", width, last=index == len(widths) - 1)
    name = "mlp" if tuple(widths) == (784, 1024, 1024, 10) else "mlp:" + "-".join(map(str, widths))
    return build_workload(name, [widths[0]], specs, samples_per_epoch=samples_per_epoch,
                          description=mlp.__doc__ or "")


ZOO.update(TRANSFORMER_ZOO)


def zoo_workload(name: str) -> Workload:
    """Build a zoo workload by name (``mlp:784-512-10`` passes widths, ``gpt:layers=...`` a
    transformer's shape)."""
    base, _, argument = name.partition(":")
    if base in PARAMETRIC:
        if not argument:
            raise InputError("workload", f"{base} needs its shape after ':', e.g. "
                             f"gpt:layers=24,hidden=1024,heads=16,seq=1024,vocab=51200")
        return PARAMETRIC[base](argument)
    if base not in ZOO:
        raise InputError("workload", f"unknown workload {short_repr(name)}: not a zoo name "
                         f"({', '.join(sorted([*ZOO, *(f'{p}:...' for p in PARAMETRIC)]))}) "
                         f"nor an existing YAML file")
    if not argument:
        return ZOO[base]()
    if base in ZOO_ARGUMENTS:
        return ZOO[base](**_zoo_arguments(base, name, argument))
    if base != "mlp":
        raise InputError("workload", f"{base} takes no arguments, got {short_repr(name)}")
    try:
        widths = tuple(int(part) for part in argument.split("-"))
    except ValueError:
        raise InputError("workload", f"mlp widths must be integers joined by '-', got "
                         f"{short_repr(argument)}") from None
    if any(width < 1 for width in widths):
        raise InputError("workload", f"mlp widths must be >= 1, got {short_repr(argument)}")
    return mlp(widths)
