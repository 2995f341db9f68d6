// Precompiled header for the ATen translation units.
#pragma once
#include <ATen/ATen.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>
