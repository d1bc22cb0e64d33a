//! Kubernetes resource quantities ("8Gi", "500m", "1.5", "2e3") as exact
//! numbers, for device capacities and the CEL `quantity()` function.

use std::cmp::Ordering;
use std::fmt;

/// A quantity in billionths (nano units): exact for every suffix the API
/// accepts from "n" to "Ei", with room to spare in an `i128`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

const NANOS_PER_UNIT: i128 = 1_000_000_000;

impl Quantity {
    pub fn from_units(units: i64) -> Self {
        Quantity {
            nanos: i128::from(units) * NANOS_PER_UNIT,
        }
    }

    /// Parses the API's quantity syntax: a signed decimal number, then a
    /// binary suffix (Ki..Ei), a decimal suffix (n, u, m, "", k, M..E) or an
    /// exponent (e3, E-2).
    pub fn parse(text: &str) -> Result<Self, String> {
        let invalid = || format!("{text:?} is not a quantity (e.g. 8Gi, 500m, 1.5)");
        let s = text.trim();
        let (negative, s) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let number_end = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (number, suffix) = s.split_at(number_end);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return Err(invalid());
        }
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        // Digits as one integer, with the decimal exponent to apply.
        let digits = format!("{whole}{fraction}");
        let mantissa: i128 = digits.parse().map_err(|_| invalid())?;
        let mut exp10: i32 = -(fraction.len() as i32);
        let mut factor: i128 = 1;
        match suffix {
            "" => {}
            "Ki" => factor = 1 << 10,
            "Mi" => factor = 1 << 20,
            "Gi" => factor = 1 << 30,
            "Ti" => factor = 1 << 40,
            "Pi" => factor = 1 << 50,
            "Ei" => factor = 1 << 60,
            "n" => exp10 -= 9,
            "u" => exp10 -= 6,
            "m" => exp10 -= 3,
            "k" => exp10 += 3,
            "M" => exp10 += 6,
            "G" => exp10 += 9,
            "T" => exp10 += 12,
            "P" => exp10 += 15,
            "E" => exp10 += 18,
            other if other.starts_with(['e', 'E']) => {
                exp10 += other[1..].parse::<i32>().map_err(|_| invalid())?;
            }
            _ => return Err(invalid()),
        }
        // Scale to nanos; precision below a nano is rounded up, as the API
        // server rounds quantities it cannot represent.
        let exp = exp10 + 9;
        let scaled = if exp >= 0 {
            10i128
                .checked_pow(exp as u32)
                .and_then(|p| mantissa.checked_mul(p))
                .and_then(|v| v.checked_mul(factor))
                .ok_or_else(invalid)?
        } else {
            let p = 10i128.checked_pow((-exp) as u32).ok_or_else(invalid)?;
            let v = mantissa.checked_mul(factor).ok_or_else(invalid)?;
            (v + p - 1) / p
        };
        Ok(Quantity {
            nanos: if negative { -scaled } else { scaled },
        })
    }

    pub(crate) fn is_integer(&self) -> bool {
        self.nanos % NANOS_PER_UNIT == 0
    }

    /// The value in whole units, when it is one and fits an `i64`.
    pub(crate) fn as_integer(&self) -> Option<i64> {
        if !self.is_integer() {
            return None;
        }
        i64::try_from(self.nanos / NANOS_PER_UNIT).ok()
    }

    /// The exact value in billionths of a unit.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn as_approximate_float(&self) -> f64 {
        self.nanos as f64 / NANOS_PER_UNIT as f64
    }

    pub fn sign(&self) -> i64 {
        match self.nanos.cmp(&0) {
            Ordering::Less => -1,
            Ordering::Equal => 0,
            Ordering::Greater => 1,
        }
    }

    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| Quantity { nanos })
    }

    pub fn checked_sub(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_sub(other.nanos)
            .map(|nanos| Quantity { nanos })
    }
}

/// How a quantity is written back (the API's formats): the suffix family
/// of the text it was read from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// "Ki", "Mi", ... ("40Gi").
    BinarySi,
    /// "m", "", "k", "M", ... ("500m", "8").
    #[default]
    DecimalSi,
    /// "e3", "E-2".
    DecimalExponent,
}

impl Format {
    /// The format of a quantity's text, as the API server infers it.
    pub fn of(text: &str) -> Format {
        let suffix = text.trim().trim_start_matches(['-', '+']);
        let suffix = suffix.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
        if suffix.ends_with('i') {
            Format::BinarySi
        } else if suffix.len() > 1 && suffix.starts_with(['e', 'E']) {
            // "E" alone is the exa suffix.
            Format::DecimalExponent
        } else {
            Format::DecimalSi
        }
    }
}

impl Quantity {
    /// The quantity's canonical text in `format`, as the API server writes
    /// it: an integer with the largest suffix that keeps it exact ("40Gi",
    /// "1500", "2k", "500m", "0"). A binary quantity below 1024, or not a
    /// whole number, is written in decimal, as there.
    pub fn canonical(&self, format: Format) -> String {
        if self.nanos == 0 {
            return "0".to_string();
        }
        if format == Format::BinarySi
            && self.nanos.abs() >= 1024 * NANOS_PER_UNIT
            && self.is_integer()
        {
            let mut amount = self.nanos / NANOS_PER_UNIT;
            let mut power = 0;
            while power < 6 && amount % 1024 == 0 {
                amount /= 1024;
                power += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
            return format!("{amount}{suffix}");
        }
        // Decimal: the mantissa without trailing zeros, its exponent then
        // lowered to a multiple of three.
        let mut amount = self.nanos;
        let mut exponent: i32 = -9;
        while amount % 10 == 0 {
            amount /= 10;
            exponent += 1;
        }
        while exponent.rem_euclid(3) != 0 || exponent > 18 {
            amount *= 10;
            exponent -= 1;
        }
        if format == Format::DecimalExponent {
            return if exponent == 0 {
                format!("{amount}")
            } else {
                format!("{amount}e{exponent}")
            };
        }
        let suffix = match exponent {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            _ => "",
        };
        format!("{amount}{suffix}")
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_integer() {
            write!(f, "{}", self.nanos / NANOS_PER_UNIT)
        } else {
            write!(f, "{}n", self.nanos)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_and_exponents_parse_exactly() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("8Gi"), Quantity::from_units(8 << 30));
        assert_eq!(q("1k"), Quantity::from_units(1000));
        assert_eq!(q("1.5"), q("1500m"));
        assert_eq!(q("2e3"), Quantity::from_units(2000));
        assert_eq!(q("-1"), Quantity::from_units(-1));
        assert!(q("100m") < q("1"));
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("40Gi").as_integer(), Some(40 << 30));
        assert_eq!(q("500m").as_integer(), None);
        assert_eq!(q("1Ei").as_integer(), Some(1 << 60));
    }

    #[test]
    fn canonical_text_is_the_api_servers() {
        let canonical = |s: &str| Quantity::parse(s).unwrap().canonical(Format::of(s));
        for (text, want) in [
            ("40Gi", "40Gi"),
            ("42949672960", "42949672960"),
            ("1024Mi", "1Gi"),
            ("1536", "1536"),
            ("1500", "1500"),
            ("2000", "2k"),
            ("0.5", "500m"),
            ("1.5Gi", "1536Mi"),
            ("512Ki", "512Ki"),
            ("0.5Ki", "512"),
            ("100m", "100m"),
            ("0Gi", "0"),
            ("8", "8"),
            ("2e3", "2e3"),
            ("1E-2", "10e-3"),
            ("12e0", "12"),
            ("1000k", "1M"),
        ] {
            assert_eq!(canonical(text), want, "{text}");
        }
        assert_eq!(Format::of("40Gi"), Format::BinarySi);
        assert_eq!(Format::of("-1e3"), Format::DecimalExponent);
        assert_eq!(Format::of("1E"), Format::DecimalSi);
    }

    #[test]
    fn garbage_is_refused() {
        for bad in ["", "Gi", "1.2.3", "12XB", "1e", "--1"] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
    }
}
