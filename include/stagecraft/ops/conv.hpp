// im2col / col2im primitives and nn::conv2d (NCHW x OIHW) built on them.
#pragma once
