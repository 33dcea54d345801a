//! The number policy: which numbers are JSON here, how they are read back and how canonical
//! text writes them. Every place numbers cross between JSON and a host language (the binding's
//! converter both ways, the tool arguments' fast path, the canonical text of request options)
//! asks this module, so the rule is written once:
//!
//! - an integer is JSON when it fits `i64` or `u64` (what most JSON readers keep exact); a wider
//!   one is refused, to be sent as a string;
//! - a float is JSON when it is finite: NaN and the infinities are refused, `-0.0` is kept;
//! - a JSON number reads back as an `i64` when it is one, else a `u64`, else a float ([`Num`]);
//! - parsed from text, a float at or beyond 2⁶³ in magnitude, or `-0.0`, may have been written as
//!   an integer literal (`1e19` is a float, `18446744073709551616` and `-0` are integers to a
//!   reader that keeps integers exact, Python's `json` among them), so [`parse_exact`] leaves
//!   such text to that reader;
//! - canonical text writes integers in decimal and floats in the shortest digits that read back
//!   as the same float, laid out as Python's `repr` lays them out (`1e+16`, `1.5e-07`, `100.0`).

use std::fmt;

use serde_json::{Number, Value};

/// Why a number is not JSON here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum NumberError {
    /// An integer outside `[-2⁶³, 2⁶⁴-1]`.
    IntegerRange,
    /// NaN, `inf` or `-inf`.
    NotFinite(f64),
}

impl fmt::Display for NumberError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumberError::IntegerRange => f.write_str("integer out of the 64-bit range is not lossless JSON (use a string)"),
            NumberError::NotFinite(x) if x.is_nan() => f.write_str("NaN is not lossless JSON"),
            NumberError::NotFinite(x) if *x > 0.0 => f.write_str("inf is not lossless JSON"),
            NumberError::NotFinite(_) => f.write_str("-inf is not lossless JSON"),
        }
    }
}

impl std::error::Error for NumberError {}

/// An integer as a JSON number, if it is one.
pub fn integer(n: i128) -> Result<Number, NumberError> {
    if let Ok(i) = i64::try_from(n) {
        return Ok(Number::from(i));
    }
    u64::try_from(n).map(Number::from).map_err(|_| NumberError::IntegerRange)
}

/// A float as a JSON number, if it is one.
pub fn float(f: f64) -> Result<Number, NumberError> {
    Number::from_f64(f).ok_or(NumberError::NotFinite(f))
}

/// A JSON number as a host reads it back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(i64),
    UInt(u64),
    Float(f64),
}

impl Num {
    pub fn of(n: &Number) -> Num {
        if let Some(i) = n.as_i64() {
            Num::Int(i)
        } else if let Some(u) = n.as_u64() {
            Num::UInt(u)
        } else {
            Num::Float(n.as_f64().unwrap_or(f64::NAN))
        }
    }
}

/// 2⁶³: every integer literal `serde_json` reads as a float is at least this far from zero.
const WIDE: f64 = 9_223_372_036_854_775_808.0;

/// Whether a float parsed from text is the number a reader keeping integers exact would read:
/// not `-0.0` (the literal `-0` is the integer 0) and below 2⁶³ in magnitude (an integer
/// literal wider than 64 bits reads as a float here).
fn read_exactly(f: f64) -> bool {
    f.abs() < WIDE && !(f == 0.0 && f.is_sign_negative())
}

/// JSON text parsed, when every number in it is the number a reader that keeps integer literals
/// exact would read; `None` when it is not JSON or some number may not be (see the module doc),
/// for such a reader to parse instead.
pub fn parse_exact(text: &str) -> Option<Value> {
    fn exact(value: &Value) -> bool {
        match value {
            Value::Number(n) => match Num::of(n) {
                Num::Int(_) | Num::UInt(_) => true,
                Num::Float(f) => read_exactly(f),
            },
            Value::Array(items) => items.iter().all(exact),
            Value::Object(map) => map.values().all(exact),
            _ => true,
        }
    }
    let value: Value = serde_json::from_str(text).ok()?;
    exact(&value).then_some(value)
}

/// Appends `n` as canonical text writes it: an integer in decimal, a float in its shortest
/// round-trip digits, in exponent form when its decimal exponent is below -4 or above 15
/// (`1e-05`, `1e+16`, a signed exponent of at least two digits), else positionally with at
/// least one fractional digit (`0.0001`, `100.0`).
pub fn push_number(out: &mut String, n: &Number) {
    match Num::of(n) {
        Num::Int(i) => out.push_str(itoa::Buffer::new().format(i)),
        Num::UInt(u) => out.push_str(itoa::Buffer::new().format(u)),
        Num::Float(f) => push_float(out, f),
    }
}

fn push_float(out: &mut String, f: f64) {
    // `{:e}` gives the shortest digits that read back as `f`: `d[.ddd]e[-]x`.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if f.is_sign_negative() {
        out.push('-');
    }
    if !(-4..16).contains(&exponent) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push_str(if exponent < 0 { "e-" } else { "e+" });
        let magnitude = exponent.unsigned_abs();
        if magnitude < 10 {
            out.push('0');
        }
        out.push_str(itoa::Buffer::new().format(magnitude));
        return;
    }
    // The decimal point falls after `point` digits (before the first when it is 0 or less).
    let point = exponent + 1;
    match usize::try_from(point) {
        Ok(at) if at > 0 && at < digits.len() => {
            out.push_str(&digits[..at]);
            out.push('.');
            out.push_str(&digits[at..]);
        }
        Ok(at) if at > 0 => {
            out.push_str(&digits);
            (digits.len()..at).for_each(|_| out.push('0'));
            out.push_str(".0");
        }
        _ => {
            out.push_str("0.");
            (0..-point).for_each(|_| out.push('0'));
            out.push_str(&digits);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_json_within_64_bits_either_signed_or_not() {
        assert_eq!(integer(0).unwrap(), Number::from(0));
        assert_eq!(integer(i64::MIN.into()).unwrap(), Number::from(i64::MIN));
        assert_eq!(integer(u64::MAX.into()).unwrap(), Number::from(u64::MAX));
        assert_eq!(integer(i128::from(i64::MAX) + 1).unwrap().as_u64(), Some(1 << 63));
        assert_eq!(integer(i128::from(u64::MAX) + 1), Err(NumberError::IntegerRange));
        assert_eq!(integer(i128::from(i64::MIN) - 1), Err(NumberError::IntegerRange));
        assert_eq!(NumberError::IntegerRange.to_string(), "integer out of the 64-bit range is not lossless JSON (use a string)");
    }

    #[test]
    fn floats_are_json_when_finite_and_negative_zero_stays_negative() {
        for (x, said) in [(f64::NAN, "NaN"), (f64::INFINITY, "inf"), (f64::NEG_INFINITY, "-inf")] {
            let refused = float(x).unwrap_err();
            assert_eq!(refused.to_string(), format!("{said} is not lossless JSON"));
        }
        let zero = float(-0.0).unwrap();
        assert!(zero.as_f64().unwrap().is_sign_negative());
        assert_eq!(serde_json::to_string(&zero).unwrap(), "-0.0");
        assert_eq!(float(f64::MAX).unwrap().as_f64(), Some(f64::MAX));
    }

    #[test]
    fn numbers_read_back_signed_first_then_unsigned_then_float() {
        assert_eq!(Num::of(&Number::from(-1)), Num::Int(-1));
        assert_eq!(Num::of(&Number::from(7u64)), Num::Int(7));
        assert_eq!(Num::of(&Number::from(u64::MAX)), Num::UInt(u64::MAX));
        assert_eq!(Num::of(&float(1.0).unwrap()), Num::Float(1.0));
    }

    #[test]
    fn parse_exact_leaves_wide_integers_and_negative_zero_to_an_exact_reader() {
        let parsed = |text: &str| parse_exact(text).map(|v| serde_json::to_string(&v).unwrap());
        assert_eq!(parsed(r#"{"a": [1, -2, 1.5, "x", null]}"#).as_deref(), Some(r#"{"a":[1,-2,1.5,"x",null]}"#));
        assert_eq!(parsed("18446744073709551615").as_deref(), Some("18446744073709551615"));
        assert_eq!(parsed("-9223372036854775808").as_deref(), Some("-9223372036854775808"));
        for wide in ["18446744073709551616", "-9223372036854775809", "[0, {\"n\": 1e19}]", "-0", "-0.0", "1e400", "nope", ""] {
            assert_eq!(parsed(wide), None, "{wide}");
        }
        assert_eq!(parse_exact("9.2e18"), Some(Value::from(9.2e18)));
        assert_eq!(parsed("0.0").as_deref(), Some("0.0"));
    }

    #[test]
    #[allow(clippy::unreadable_literal, reason = "each literal reads digit for digit against its expected text")]
    fn canonical_numbers_are_laid_out_as_python_repr_lays_them_out() {
        // Each right-hand side is Python's `repr` (and `json.dumps`) of the left.
        let cases: [(f64, &str); 22] = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456789.125, "123456789.125"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (9.2e18, "9.2e+18"),
            (1e100, "1e+100"),
            (-1e-100, "-1e-100"),
            (f64::MAX, "1.7976931348623157e+308"),
            (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
            (5e-324, "5e-324"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1.0 / 3.0, "0.3333333333333333"),
            (123.456e-5, "0.00123456"),
        ];
        for (x, python) in cases {
            let mut out = String::new();
            push_number(&mut out, &float(x).unwrap());
            assert_eq!(out, python, "{x:e}");
        }
        let mut out = String::new();
        for n in [Number::from(i64::MIN), Number::from(u64::MAX), Number::from(0)] {
            push_number(&mut out, &n);
            out.push(' ');
        }
        assert_eq!(out, "-9223372036854775808 18446744073709551615 0 ");
    }
}
