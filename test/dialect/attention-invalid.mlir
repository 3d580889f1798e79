// RUN: kiln-opt %s --split-input-file --verify-diagnostics

// One case per verifier error of kiln.attention and kiln.attention_grad.

func.func @rank(%q: tensor<4x16x8xf32>, %k: tensor<2x4x16x8xf32>) {
  // expected-error @+1 {{query and value must be [batch, heads, sequence, head size]}}
  %o, %l = kiln.attention %q, %k, %k scale = 1.0 : tensor<4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
  return
}

// -----

func.func @heads(%q: tensor<2x4x16x8xf32>, %k: tensor<2x3x16x8xf32>) {
  // expected-error @+1 {{the key/value heads (3) must divide the query heads (4)}}
  %o, %l = kiln.attention %q, %k, %k scale = 1.0 : tensor<2x4x16x8xf32>, tensor<2x3x16x8xf32>, tensor<2x3x16x8xf32>
  return
}

// -----

func.func @head_size(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x16x4xf32>) {
  // expected-error @+1 {{query and key must have one head size, got 8 and 4}}
  %o, %l = kiln.attention %q, %k, %k scale = 1.0 : tensor<2x4x16x8xf32>, tensor<2x4x16x4xf32>, tensor<2x4x16x4xf32>
  return
}

// -----

func.func @causal_rectangle(%q: tensor<2x4x16x8xf32>, %k: tensor<2x4x12x8xf32>) {
  // expected-error @+1 {{causal attention needs as many queries as keys, got 16 and 12}}
  %o, %l = kiln.attention %q, %k, %k scale = 1.0 causal : tensor<2x4x16x8xf32>, tensor<2x4x12x8xf32>, tensor<2x4x12x8xf32>
  return
}

// -----

func.func @dropout_seed(%q: tensor<2x4x16x8xf32>) {
  // expected-error @+1 {{dropout > 0 needs a seed}}
  %o, %l = kiln.attention %q, %q, %q scale = 1.0 {dropout = 0.5 : f64} : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
  return
}

// -----

func.func @mask_shape(%q: tensor<2x4x16x8xf32>, %m: tensor<16x15xi1>) {
  // expected-error @+1 {{the mask must be [16, 16] or [2 or 1, 4 or 1, 16, 16], got [16, 15]}}
  %o, %l = kiln.attention %q, %q, %q mask(%m : tensor<16x15xi1>) scale = 1.0 : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
  return
}

// -----

func.func @mask_type(%q: tensor<2x4x16x8xf32>, %m: tensor<16x16xi32>) {
  // expected-error @+1 {{the mask must be i1 (keep where true) or of the query's type}}
  %o, %l = kiln.attention %q, %q, %q mask(%m : tensor<16x16xi32>) scale = 1.0 : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>
  return
}

// -----

func.func @grad_lse(%q: tensor<2x4x16x8xf32>, %l: tensor<2x4x16xbf16>) {
  // expected-error @+1 {{lse must be 'tensor<2x4x16xf32>', the forward's log-sum-exp}}
  %a, %b, %c = kiln.attention_grad %q, %q, %q, %q, %l, %q scale = 1.0 : tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16x8xf32>, tensor<2x4x16xbf16>, tensor<2x4x16x8xf32>
  return
}
