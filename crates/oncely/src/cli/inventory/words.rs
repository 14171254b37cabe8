//! The words of a text, as the inventory reads names and descriptions.

/// Lower-case words: split at anything not a letter or digit, and at camelCase humps.
pub(super) fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_at_punctuation_and_camel_case_humps() {
        assert_eq!(
            words("Keys must be unique for every CreatePayment request; don't reuse UUIDs"),
            [
                "keys", "must", "be", "unique", "for", "every", "create", "payment", "request",
                "don", "t", "reuse", "uuids"
            ]
        );
    }
}
