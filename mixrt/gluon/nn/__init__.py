"""mixrt.gluon.nn: neural network layers, MXNet's names, arguments and defaults.

    from mixrt.gluon import nn
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(nn.Conv2D(16, kernel_size=3, padding=1, activation="relu"),
                nn.BatchNorm(), nn.MaxPool2D(), nn.Flatten(), nn.Dense(10))
    net.initialize(mixrt.initializer.Xavier())   # in_channels / in_units from the first call
    net.hybridize()
"""

from mixrt.gluon.block import Block, Sequential
from mixrt.gluon.hybrid import HybridBlock, HybridSequential
from mixrt.gluon.nn.activations import (ELU, GELU, SELU, Activation, LeakyReLU, PReLU,
                                        Swish)
from mixrt.gluon.nn.basic_layers import (BatchNorm, Dense, Dropout, Embedding, Flatten,
                                         HybridLambda, Lambda, LayerNorm)
from mixrt.gluon.nn.conv_layers import (AvgPool1D, AvgPool2D, AvgPool3D, Conv1D,
                                        Conv1DTranspose, Conv2D, Conv2DTranspose, Conv3D,
                                        Conv3DTranspose, GlobalAvgPool1D, GlobalAvgPool2D,
                                        GlobalAvgPool3D, GlobalMaxPool1D, GlobalMaxPool2D,
                                        GlobalMaxPool3D, MaxPool1D, MaxPool2D, MaxPool3D,
                                        ReflectionPad2D)
from mixrt.gluon.nn.norm_layers import GroupNorm, InstanceNorm
from mixrt.gluon.symbol_block import SymbolBlock  # MXNet names it here too

__all__ = ["Block", "HybridBlock", "Sequential", "HybridSequential", "Dense", "Dropout",
           "BatchNorm", "LayerNorm", "Embedding", "Flatten", "Lambda", "HybridLambda",
           "Activation", "LeakyReLU", "PReLU", "ELU", "SELU", "GELU", "Swish", "Conv1D",
           "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose",
           "MaxPool1D", "MaxPool2D", "MaxPool3D", "AvgPool1D", "AvgPool2D", "AvgPool3D",
           "GlobalAvgPool1D", "GlobalAvgPool2D", "GlobalAvgPool3D", "GlobalMaxPool1D",
           "GlobalMaxPool2D", "GlobalMaxPool3D", "ReflectionPad2D", "InstanceNorm",
           "GroupNorm", "SymbolBlock"]
