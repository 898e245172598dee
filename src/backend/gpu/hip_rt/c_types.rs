//! Test-only: the C spelling of the types and function pointers the hand-written bindings
//! pass across the boundary, from which `c_check` generates its C program.

use std::ffi::{c_char, c_int, c_void};

/// The C spelling of a type the bindings pass across the boundary.
pub trait CType {
    fn c() -> String;
}

/// `impl CType` for each `type => "C name"` pair (the bindings name their own types too).
macro_rules! c_names {
    ($($t:ty => $c:literal,)*) => {
        $(impl $crate::backend::gpu::hip_rt::c_types::CType for $t {
            fn c() -> String {
                $c.into()
            }
        })*
    };
}
pub(super) use c_names;

c_names! {
    c_void => "void",
    c_char => "char",
    c_int => "int",
    usize => "size_t",
}

impl<T: CType> CType for *mut T {
    fn c() -> String {
        format!("{}*", T::c())
    }
}

impl<T: CType> CType for *const T {
    fn c() -> String {
        format!("const {}*", T::c())
    }
}

/// A C function pointer type, declared as a variable initialized from a symbol.
pub trait CFn {
    /// `ret (*var)(args) = symbol;`
    fn declare(var: &str, symbol: &str) -> String;
}

macro_rules! c_fn {
    ($($a:ident),*) => {
        impl<R: CType, $($a: CType),*> CFn for unsafe extern "C" fn($($a),*) -> R {
            fn declare(var: &str, symbol: &str) -> String {
                let args: Vec<String> = vec![$($a::c()),*];
                let args = match args.is_empty() {
                    true => "void".to_string(),
                    false => args.join(", "),
                };
                format!("{} (*{var})({args}) = {symbol};", R::c())
            }
        }
    };
}

c_fn!();
c_fn!(A);
c_fn!(A, B);
c_fn!(A, B, C);
c_fn!(A, B, C, D);
c_fn!(A, B, C, D, E);
c_fn!(A, B, C, D, E, F);
c_fn!(A, B, C, D, E, F, G);
