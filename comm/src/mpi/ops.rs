//! How each element type and reduction maps onto MPI: datatypes, and the user-defined operations
//! for what MPI lacks.
//!
//! - `f32`/`f64` sums use MPI's predefined `MPI_SUM` on `MPI_FLOAT`/`MPI_DOUBLE`.
//! - `f16`/`bf16` have no MPI datatype: they travel as `MPI_UINT16_T` and are summed by
//!   user-defined operations that add pairs in `f32` and round once to the half type, which is
//!   exactly IEEE half addition, the same per-step rounding as the thread backend. No conversion
//!   copy of the buffer is made.
//! - Max and min of every float type use user-defined operations that propagate NaN, like the
//!   thread backend (MPI's predefined `MPI_MAX`/`MPI_MIN` keep or drop a NaN depending on the
//!   order in which the implementation combines ranks).
//!
//! All user-defined operations are commutative, so MPI may use its usual algorithms.

use super::ffi::{Op, check};
use crate::buffer::Element;
use crate::error::CommError;
use crate::signature::ReduceOp;
use half::{bf16, f16};
use mpi::ffi;
use std::ffi::{c_int, c_void};

const SUM: u8 = 0;
const MAX: u8 = 1;
const MIN: u8 = 2;

/// The `MPI_User_function` for reduction `OP` over elements of type `T`:
/// `inout[i] = in[i] OP inout[i]`.
unsafe extern "C" fn reduce<T: Element, const OP: u8>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut ffi::MPI_Datatype,
) {
    // SAFETY: MPI passes two buffers of `*len` elements of the datatype this operation was
    // registered for (2-byte halves as MPI_UINT16_T, or MPI_FLOAT/MPI_DOUBLE); they do not
    // overlap.
    let (src, dst) = unsafe {
        let n = (*len).max(0) as usize;
        (
            std::slice::from_raw_parts(invec as *const T, n),
            std::slice::from_raw_parts_mut(inoutvec as *mut T, n),
        )
    };
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = match OP {
            SUM => s.add(*d),
            MAX => pick(s, *d, |a, b| b > a),
            _ => pick(s, *d, |a, b| b < a),
        };
    }
}

/// `b` if it wins over `a` or is NaN, else `a` (NaN propagates whichever side it is on).
#[inline(always)]
fn pick<T: Element>(a: T, b: T, wins: impl Fn(T, T) -> bool) -> T {
    if wins(a, b) || b.partial_cmp(&b).is_none() {
        b
    } else {
        a
    }
}

type UserFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut ffi::MPI_Datatype);

fn create(f: UserFn) -> Result<Op, CommError> {
    // SAFETY: a zero-initialised handle is overwritten by MPI_Op_create on success.
    let mut op: ffi::MPI_Op = unsafe { std::mem::zeroed() };
    // SAFETY: `f` has the MPI_User_function signature and lives for the whole program.
    let rc = unsafe { ffi::MPI_Op_create(Some(f), 1, &mut op) };
    check(rc, || "MPI_Op_create".into())?;
    Ok(Op(op))
}

/// The user-defined operations, created once after MPI is initialised.
#[derive(Debug)]
pub(crate) struct UserOps {
    max: [Op; 4],
    min: [Op; 4],
    sum_f16: Op,
    sum_bf16: Op,
}

impl UserOps {
    pub fn create() -> Result<Self, CommError> {
        Ok(Self {
            max: [
                create(reduce::<f32, MAX>)?,
                create(reduce::<f64, MAX>)?,
                create(reduce::<f16, MAX>)?,
                create(reduce::<bf16, MAX>)?,
            ],
            min: [
                create(reduce::<f32, MIN>)?,
                create(reduce::<f64, MIN>)?,
                create(reduce::<f16, MIN>)?,
                create(reduce::<bf16, MIN>)?,
            ],
            sum_f16: create(reduce::<f16, SUM>)?,
            sum_bf16: create(reduce::<bf16, SUM>)?,
        })
    }

    /// Free every operation (before `MPI_Finalize`).
    pub fn free(&self) {
        let all = self
            .max
            .iter()
            .chain(&self.min)
            .chain([&self.sum_f16, &self.sum_bf16]);
        for op in all {
            let mut raw = op.0;
            // SAFETY: each handle was created by MPI_Op_create and is freed once, at shutdown.
            unsafe { ffi::MPI_Op_free(&mut raw) };
        }
    }
}

/// An element type as MPI sees it.
pub(crate) trait MpiElement: Element {
    /// Index into the per-type operation tables.
    const INDEX: usize;
    /// The MPI datatype one element travels as.
    fn datatype() -> ffi::MPI_Datatype;
    /// The MPI operation implementing `op`'s reduction step (a mean is a sum, divided after).
    fn op(ops: &UserOps, op: ReduceOp) -> Op {
        match op {
            ReduceOp::Sum | ReduceOp::Mean => Self::sum(ops),
            ReduceOp::Max => ops.max[Self::INDEX],
            ReduceOp::Min => ops.min[Self::INDEX],
        }
    }
    /// The summing operation.
    fn sum(ops: &UserOps) -> Op;
}

impl MpiElement for f32 {
    const INDEX: usize = 0;
    fn datatype() -> ffi::MPI_Datatype {
        // SAFETY: reading an rsmpi-exported constant.
        unsafe { ffi::RSMPI_FLOAT }
    }
    fn sum(_: &UserOps) -> Op {
        // SAFETY: reading an rsmpi-exported constant.
        Op(unsafe { ffi::RSMPI_SUM })
    }
}

impl MpiElement for f64 {
    const INDEX: usize = 1;
    fn datatype() -> ffi::MPI_Datatype {
        // SAFETY: reading an rsmpi-exported constant.
        unsafe { ffi::RSMPI_DOUBLE }
    }
    fn sum(_: &UserOps) -> Op {
        // SAFETY: reading an rsmpi-exported constant.
        Op(unsafe { ffi::RSMPI_SUM })
    }
}

impl MpiElement for f16 {
    const INDEX: usize = 2;
    fn datatype() -> ffi::MPI_Datatype {
        // SAFETY: reading an rsmpi-exported constant.
        unsafe { ffi::RSMPI_UINT16_T }
    }
    fn sum(ops: &UserOps) -> Op {
        ops.sum_f16
    }
}

impl MpiElement for bf16 {
    const INDEX: usize = 3;
    fn datatype() -> ffi::MPI_Datatype {
        // SAFETY: reading an rsmpi-exported constant.
        unsafe { ffi::RSMPI_UINT16_T }
    }
    fn sum(ops: &UserOps) -> Op {
        ops.sum_bf16
    }
}
