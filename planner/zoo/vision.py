"""Vision models of the zoo: ResNet-50/101/152, Wide-ResNet-50-2 and VGG-16 (torchvision shapes).

BatchNorm statistics are per device under batch splitting (standard data-parallel semantics, not
SyncBatchNorm); spatial dims of convolutions and pooling are never split (no halo exchange).
Default global batch: 64 images of 224x224.
"""

from __future__ import annotations

from planner.ir.graph import Graph
from planner.ir.ops import GraphBuilder

VISION_BATCH = 64
NO_SPATIAL = "HW"


def _conv(
    gb: GraphBuilder,
    name: str,
    x: str,
    out_channels: int,
    kernel: int,
    stride: int = 1,
    bias: bool = False,
) -> str:
    _, cin, height, width = gb.shape(x)
    sizes = {
        "o": out_channels,
        "r": kernel,
        "t": kernel,
        "p": height // stride,
        "q": width // stride,
    }
    inputs = [x, gb.param(f"{name}.weight", (out_channels, cin, kernel, kernel))]
    equation = "bcHW,ocrt->bopq"
    if bias:
        inputs.append(gb.param(f"{name}.bias", (out_channels,)))
        equation = "bcHW,ocrt,o->bopq"
    return gb.op("conv2d", name, equation, inputs, sizes=sizes)


def _bn(gb: GraphBuilder, name: str, x: str) -> str:
    c = gb.shape(x)[1]
    return gb.op(
        "batchnorm",
        name,
        "bcHW,c,c->bcHW",
        [x, gb.param(f"{name}.weight", (c,)), gb.param(f"{name}.bias", (c,))],
        unsplittable=NO_SPATIAL,
    )


def _relu(gb: GraphBuilder, name: str, x: str) -> str:
    return gb.op("relu", name, "bcHW->bcHW", [x], unsplittable=NO_SPATIAL)


def _maxpool(gb: GraphBuilder, name: str, x: str, kernel: int, stride: int) -> str:
    _, _, height, width = gb.shape(x)
    return gb.op(
        "maxpool",
        name,
        "bcHW->bcpq",
        [x],
        sizes={"p": height // stride, "q": width // stride},
        attrs={"kernel": kernel, "stride": stride, "padding": (kernel - 1) // 2},
    )


def _classifier_loss(gb: GraphBuilder, x: str, batch: int, classes: int) -> None:
    labels = gb.data("labels", (batch,), integer=True)
    logits = gb.op(
        "linear",
        "fc",
        "bc,nc,n->bn",
        [x, gb.param("fc.weight", (classes, gb.shape(x)[1])), gb.param("fc.bias", (classes,))],
    )
    gb.op("cross_entropy", "loss", "bn,b->", [logits, labels], norm="n")


def _bottleneck(
    gb: GraphBuilder, p: str, x: str, width: int, out_channels: int, stride: int
) -> str:
    y = _relu(gb, f"{p}.relu1", _bn(gb, f"{p}.bn1", _conv(gb, f"{p}.conv1", x, width, 1)))
    y = _relu(gb, f"{p}.relu2", _bn(gb, f"{p}.bn2", _conv(gb, f"{p}.conv2", y, width, 3, stride)))
    y = _bn(gb, f"{p}.bn3", _conv(gb, f"{p}.conv3", y, out_channels, 1))
    shortcut = x
    if stride != 1 or gb.shape(x)[1] != out_channels:
        shortcut = _bn(
            gb, f"{p}.downsample.bn", _conv(gb, f"{p}.downsample.conv", x, out_channels, 1, stride)
        )
    y = gb.op("add", f"{p}.residual", "bcHW,bcHW->bcHW", [y, shortcut], unsplittable=NO_SPATIAL)
    return _relu(gb, f"{p}.relu3", y)


def resnet(
    blocks: tuple[int, ...],
    batch: int = VISION_BATCH,
    width_factor: int = 1,
    classes: int = 1000,
    name: str = "resnet",
) -> Graph:
    """Bottleneck ResNet (v1.5: stride on the 3x3 conv), torchvision layout."""
    gb = GraphBuilder(name)
    x = gb.data("images", (batch, 3, 224, 224))
    x = _relu(gb, "stem.relu", _bn(gb, "stem.bn", _conv(gb, "stem.conv", x, 64, 7, 2)))
    x = _maxpool(gb, "stem.pool", x, 3, 2)
    layer = 0
    for stage, count in enumerate(blocks):
        planes = 64 * 2**stage
        for i in range(count):
            gb.layer = layer
            gb.checkpoint(x)
            x = _bottleneck(
                gb,
                f"layer{stage + 1}.{i}",
                x,
                planes * width_factor,
                planes * 4,
                2 if i == 0 and stage > 0 else 1,
            )
            layer += 1
    gb.layer = None
    gb.checkpoint(x)
    x = gb.op("avgpool", "avgpool", "bcHW->bc", [x])
    _classifier_loss(gb, x, batch, classes)
    return gb.build()


VGG16_CONFIG = (
    64,
    64,
    "M",
    128,
    128,
    "M",
    256,
    256,
    256,
    "M",
    512,
    512,
    512,
    "M",
    512,
    512,
    512,
    "M",
)


def vgg16(batch: int = VISION_BATCH, classes: int = 1000, name: str = "vgg16") -> Graph:
    """VGG-16 (configuration D) with its three fully connected layers; dropout omitted."""
    gb = GraphBuilder(name)
    x = gb.data("images", (batch, 3, 224, 224))
    conv_index = 0
    for i, item in enumerate(VGG16_CONFIG):
        gb.layer = i
        if item == "M":
            x = _maxpool(gb, f"features.{i}.pool", x, 2, 2)
            continue
        x = _relu(
            gb, f"features.{i}.relu", _conv(gb, f"features.{i}.conv", x, int(item), 3, 1, bias=True)
        )
        conv_index += 1
    gb.layer = None
    x = gb.op("reshape", "flatten", "bcHW->b(cHW)", [x])
    for j, width in enumerate((4096, 4096)):
        k = gb.shape(x)[1]
        x = gb.op(
            "linear",
            f"classifier.{j}",
            "bk,nk,n->bn",
            [
                x,
                gb.param(f"classifier.{j}.weight", (width, k)),
                gb.param(f"classifier.{j}.bias", (width,)),
            ],
        )
        x = gb.op("relu", f"classifier.{j}.relu", "bn->bn", [x])
    _classifier_loss(gb, x, batch, classes)
    return gb.build()
