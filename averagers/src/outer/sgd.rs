//! The outer optimizer's arithmetic: `torch.optim.SGD` (single-tensor path) and fairscale's
//! SlowMo slow step, on flat buffers (the book's semantics §8.3).

use crate::error::AveragerError;
use localsgd_comm::params::FlatBuffer;
use serde::{Deserialize, Serialize};

/// The float types the outer arithmetic runs in. Scalars (`lr`, `momentum`, ...) are given as
/// `f64` and rounded to the parameter type once, as torch does for a Python float applied to an
/// `f32` tensor.
pub(crate) trait Real:
    Copy + std::ops::Add<Output = Self> + std::ops::Sub<Output = Self> + std::ops::Mul<Output = Self>
{
    fn of(x: f64) -> Self;
}

impl Real for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
}

impl Real for f64 {
    fn of(x: f64) -> Self {
        x
    }
}

/// Settings of the outer SGD, with `torch.optim.SGD`'s meaning: `lr`, `momentum`, `dampening`,
/// `nesterov`, `weight_decay` (L2 added to the pseudo-gradient).
///
/// ```
/// use localsgd_averagers::OuterSgdConfig;
///
/// // DiLoCo's outer optimizer: Nesterov, lr 0.7, momentum 0.9.
/// let diloco = OuterSgdConfig::diloco();
/// assert_eq!((diloco.lr, diloco.momentum, diloco.nesterov), (0.7, 0.9, true));
/// // Plain SGD with lr 1 turns DiLoCo into periodic averaging.
/// assert!(OuterSgdConfig::sgd(1.0).validate().is_ok());
/// // torch's rule: Nesterov needs a momentum and zero dampening.
/// assert!(OuterSgdConfig::sgd(0.7).with_nesterov(true).validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OuterSgdConfig {
    /// Outer learning rate (`>= 0`).
    pub lr: f64,
    /// Momentum factor (`>= 0`; `0`: no momentum buffer at all, as torch).
    pub momentum: f64,
    /// Dampening of the momentum (torch's default 0). Not applied on the first step, whose
    /// buffer is a copy of the pseudo-gradient.
    pub dampening: f64,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
    /// L2 penalty added to the pseudo-gradient (`>= 0`).
    pub weight_decay: f64,
}

impl OuterSgdConfig {
    /// Plain SGD with learning rate `lr`: no momentum, dampening or weight decay.
    pub fn sgd(lr: f64) -> Self {
        Self {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// DiLoCo's outer optimizer (paper, OpenDiLoCo and torchft's example): Nesterov, lr 0.7,
    /// momentum 0.9.
    pub fn diloco() -> Self {
        Self::sgd(0.7).with_momentum(0.9).with_nesterov(true)
    }

    /// The same settings with momentum `momentum`.
    pub fn with_momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    /// The same settings with dampening `dampening`.
    pub fn with_dampening(mut self, dampening: f64) -> Self {
        self.dampening = dampening;
        self
    }

    /// The same settings with or without Nesterov momentum.
    pub fn with_nesterov(mut self, nesterov: bool) -> Self {
        self.nesterov = nesterov;
        self
    }

    /// The same settings with weight decay `weight_decay`.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// torch's checks, in its order (lr, momentum, weight decay, Nesterov), plus finiteness.
    pub fn validate(&self) -> Result<(), AveragerError> {
        let non_negative = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(AveragerError::Outer(format!(
                    "outer {name} must be a finite number >= 0 (got {v})"
                )))
            }
        };
        non_negative("lr", self.lr)?;
        non_negative("momentum", self.momentum)?;
        non_negative("weight_decay", self.weight_decay)?;
        if !self.dampening.is_finite() {
            return Err(AveragerError::Outer(format!(
                "outer dampening must be finite (got {})",
                self.dampening
            )));
        }
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(AveragerError::Outer(format!(
                "Nesterov momentum requires a momentum and zero dampening (got momentum {}, \
                 dampening {}; valid: momentum > 0 and dampening 0, or nesterov off)",
                self.momentum, self.dampening
            )));
        }
        Ok(())
    }
}

/// `torch.optim.SGD` on one flat parameter buffer, with its state (the momentum buffer, `None`
/// until the first step: `None` and zeros differ when dampening is not 0).
#[derive(Debug, Clone, PartialEq)]
pub struct OuterSgd {
    config: OuterSgdConfig,
    buffer: Option<FlatBuffer>,
}

impl OuterSgd {
    /// A fresh optimizer (no momentum buffer). Fails on settings torch refuses.
    pub fn new(config: OuterSgdConfig) -> Result<Self, AveragerError> {
        config.validate()?;
        Ok(Self {
            config,
            buffer: None,
        })
    }

    /// The settings.
    pub fn config(&self) -> &OuterSgdConfig {
        &self.config
    }

    /// torch's `momentum_buffer` (`None` before the first step and whenever `momentum == 0`).
    pub fn momentum_buffer(&self) -> Option<&FlatBuffer> {
        self.buffer.as_ref()
    }

    /// Replace the momentum buffer (restoring a checkpoint).
    pub fn set_momentum_buffer(&mut self, buffer: Option<FlatBuffer>) {
        self.buffer = buffer;
    }

    /// One step: `param <- SGD(param, grad)`, exactly as `torch.optim.SGD.step` computes it
    /// (each operation rounded separately; no fused multiply-add). `param`, `grad` and the
    /// momentum buffer must share element type and length.
    pub fn step(&mut self, param: &mut FlatBuffer, grad: &FlatBuffer) -> Result<(), AveragerError> {
        let (ptype, plen) = (type_name(param), param.len());
        let mismatch = |what: &str| {
            AveragerError::Outer(format!(
                "outer step on a {ptype} buffer of {plen} elements: {what}"
            ))
        };
        if param.len() != grad.len() || type_name(param) != type_name(grad) {
            return Err(mismatch(&format!(
                "the pseudo-gradient is a {} buffer of {} elements",
                type_name(grad),
                grad.len()
            )));
        }
        if let Some(b) = &self.buffer
            && (b.len() != param.len() || type_name(b) != type_name(param))
        {
            return Err(mismatch(&format!(
                "the momentum buffer is a {} buffer of {} elements",
                type_name(b),
                b.len()
            )));
        }
        let config = self.config;
        match (param, grad) {
            (FlatBuffer::F32(p), FlatBuffer::F32(g)) => {
                let mut buf = match self.buffer.take() {
                    Some(FlatBuffer::F32(b)) => Some(b),
                    _ => None,
                };
                sgd_step(&config, p, g, &mut buf);
                self.buffer = buf.map(FlatBuffer::F32);
            }
            (FlatBuffer::F64(p), FlatBuffer::F64(g)) => {
                let mut buf = match self.buffer.take() {
                    Some(FlatBuffer::F64(b)) => Some(b),
                    _ => None,
                };
                sgd_step(&config, p, g, &mut buf);
                self.buffer = buf.map(FlatBuffer::F64);
            }
            _ => return Err(mismatch("element types differ")),
        }
        Ok(())
    }
}

pub(crate) fn type_name(b: &FlatBuffer) -> &'static str {
    match b {
        FlatBuffer::F32(_) => "f32",
        FlatBuffer::F64(_) => "f64",
    }
}

fn sgd_step<T: Real>(c: &OuterSgdConfig, p: &mut [T], g: &[T], buf: &mut Option<Vec<T>>) {
    let mut d: Vec<T> = if c.weight_decay != 0.0 {
        let wd = T::of(c.weight_decay);
        g.iter().zip(p.iter()).map(|(&g, &p)| g + wd * p).collect()
    } else {
        g.to_vec()
    };
    if c.momentum != 0.0 {
        let m = T::of(c.momentum);
        let keep = T::of(1.0 - c.dampening);
        let b = match buf.take() {
            // First step: the buffer is a copy of the gradient, no dampening.
            None => d.clone(),
            Some(mut b) => {
                for (b, &d) in b.iter_mut().zip(&d) {
                    *b = *b * m + keep * d;
                }
                b
            }
        };
        if c.nesterov {
            for (d, &b) in d.iter_mut().zip(&b) {
                *d = *d + m * b;
            }
        } else {
            d.copy_from_slice(&b);
        }
        *buf = Some(b);
    }
    let step = T::of(-c.lr);
    for (p, &d) in p.iter_mut().zip(&d) {
        *p = *p + step * d;
    }
}

/// fairscale's slow step (`_perform_local_optimization`), given the replicas' average `p`, the
/// global parameters `old` and the slow momentum `gmb`, at inner learning rate `gamma`:
/// `gmb = β·gmb − p/γ + old/γ; old = old − γα·gmb; p = old`, each torch operation rounded on its
/// own.
pub(crate) fn slow_step<T: Real>(
    alpha: f64,
    beta: f64,
    gamma: f64,
    p: &mut [T],
    old: &mut [T],
    gmb: &mut [T],
) {
    let inv = T::of(1.0 / gamma);
    let beta = T::of(beta);
    let step = T::of(-gamma * alpha);
    for ((p, o), u) in p.iter_mut().zip(old.iter_mut()).zip(gmb.iter_mut()) {
        let mut v = *u * beta;
        v = v - inv * *p;
        v = v + inv * *o;
        *u = v;
        *o = *o + step * v;
        *p = *o;
    }
}
