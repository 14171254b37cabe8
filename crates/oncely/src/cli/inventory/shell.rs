//! Command lines as a POSIX shell splits them (`--mcp-command 'COMMAND ARGS'`), and
//! words quoted back for one (the `oncely mcp -- COMMAND` lines the inventory proposes).
//!
//! Only the splitting: words are separated by blanks, single quotes keep everything
//! literally, double quotes keep everything but a backslash before `"`, `\`, `$` or a
//! backtick, and a backslash outside quotes keeps the next character. Nothing is
//! expanded (`$VAR`, `~`, `*` stay as written) and there are no operators (`|`, `;`,
//! `>` are characters of a word): the command is started directly, not by a shell.

/// The words of a command line; an unterminated quote or a backslash at the very end is
/// an error, and so is a line with no word.
pub(super) fn split(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    // Whether a word is under way: `''` is a word, the empty one.
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' | '\r' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err("unterminated single quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => word.push(c),
                            // A line continuation.
                            Some('\n') => {}
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err("unterminated double quote".into()),
                        },
                        Some(c) => word.push(c),
                        None => return Err("unterminated double quote".into()),
                    }
                }
            }
            '\\' => match chars.next() {
                // A line continuation: nothing, not even a word break.
                Some('\n') => {}
                Some(c) => {
                    in_word = true;
                    word.push(c);
                }
                None => return Err("a backslash at the end escapes nothing".into()),
            },
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    if words.is_empty() {
        return Err("no command".into());
    }
    Ok(words)
}

/// A word as a shell reads it back: as it is when it needs no quoting, else in single
/// quotes (a `'` in it as `'\''`).
pub(super) fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Vec<String> {
        split(line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    #[test]
    fn blanks_separate_words() {
        assert_eq!(ok("python server.py"), ["python", "server.py"]);
        assert_eq!(
            ok("  npx  -y\t@scope/server-x \n --port=3 "),
            ["npx", "-y", "@scope/server-x", "--port=3"]
        );
        assert_eq!(ok("one"), ["one"]);
    }

    #[test]
    fn single_quotes_keep_everything_literally() {
        assert_eq!(
            ok(r#"run 'a b'  'x"y\z $HOME `id`'"#),
            ["run", "a b", r#"x"y\z $HOME `id`"#]
        );
        assert_eq!(ok("run ''"), ["run", ""]);
        assert_eq!(ok("run '' ''"), ["run", "", ""]);
        assert_eq!(ok("run pre'mid dle'post"), ["run", "premid dlepost"]);
        assert_eq!(ok(r"run 'it'\''s'"), ["run", "it's"]);
    }

    #[test]
    fn double_quotes_escape_only_quote_backslash_dollar_and_backtick() {
        assert_eq!(
            ok(r#"run "a \"b\" \\ \$x \`y\`""#),
            ["run", r#"a "b" \ $x `y`"#]
        );
        // Any other backslash stays, with its character.
        assert_eq!(ok(r#"run "C:\path\n""#), ["run", r"C:\path\n"]);
        assert_eq!(ok(r#"run "it's" """#), ["run", "it's", ""]);
        assert_eq!(ok("run \"a\\\nb\""), ["run", "ab"]);
        assert_eq!(ok(r#"run "a"'b'c"#), ["run", "abc"]);
    }

    #[test]
    fn a_backslash_outside_quotes_keeps_the_next_character() {
        assert_eq!(
            ok(r#"run a\ b \'c \\ \"d"#),
            ["run", "a b", "'c", "\\", "\"d"]
        );
        assert_eq!(ok("run a\\\nb"), ["run", "ab"]);
        // An escaped blank is a word of its own.
        assert_eq!(ok(r"run \ "), ["run", " "]);
    }

    #[test]
    fn nothing_is_expanded_and_there_are_no_operators() {
        assert_eq!(
            ok("run $HOME ~ *.py a|b c;d >e #f"),
            ["run", "$HOME", "~", "*.py", "a|b", "c;d", ">e", "#f"]
        );
    }

    #[test]
    fn unterminated_quotes_and_empty_lines_are_errors() {
        for (line, error) in [
            ("run 'a b", "unterminated single quote"),
            ("run \"a b", "unterminated double quote"),
            ("run \"a\\\"", "unterminated double quote"),
            ("run \"a\\", "unterminated double quote"),
            ("run 'a\"b\"", "unterminated single quote"),
            ("run a\\", "a backslash at the end escapes nothing"),
            ("", "no command"),
            (" \t\n", "no command"),
        ] {
            assert_eq!(split(line), Err(error.to_owned()), "{line:?}");
        }
    }

    #[test]
    fn quoted_words_split_back_into_themselves() {
        assert_eq!(quote("python"), "python");
        assert_eq!(quote("/usr/bin/x-y_z.py"), "/usr/bin/x-y_z.py");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("it's"), r"'it'\''s'");
        let words = [
            "prog",
            "",
            "a b",
            "it's",
            r#"x"y"#,
            r"back\slash",
            "$HOME",
            "`id`",
            "tab\there",
            "line\nbreak",
            "*",
            "#",
            "ünïcode",
        ];
        let line: Vec<String> = words.iter().map(|w| quote(w)).collect();
        assert_eq!(ok(&line.join(" ")), words);
    }
}
