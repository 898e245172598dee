//! How a tool-call format writes its calls: the data each format file declares and the
//! shared parser reads.

/// How a format writes its calls.
#[derive(Debug)]
pub struct Syntax {
    /// Markers that begin tool markup anywhere in the reply.
    pub markers: &'static [&'static str],
    /// A character that begins markup when it is the first non-blank text of the reply.
    pub lead: Option<char>,
    /// After a marker the calls may come as a JSON list (`[{...}, {...}]`).
    pub list: bool,
    /// Text closing each call (`</tool_call>`).
    pub close: Option<&'static str>,
    /// Separates calls outside a list (`;`).
    pub separator: Option<char>,
    /// Members holding the arguments.
    pub args_keys: &'static [&'static str],
}

/// Hermes-style calls (Qwen2.5, Qwen3, Hermes 2/3, Kiln's default template):
pub static HERMES: Syntax = Syntax {
    markers: &["<tool_call>"],
    lead: None,
    list: false,
    close: Some("</tool_call>"),
    separator: None,
    args_keys: &["arguments", "parameters"],
};

/// Llama 3.1/3.2 JSON calls: the reply is `{"name": ..., "parameters": {...}}` (after
pub static LLAMA3_JSON: Syntax = Syntax {
    markers: &["<|python_tag|>"],
    lead: Some('{'),
    list: false,
    close: None,
    separator: Some(';'),
    args_keys: &["parameters", "arguments"],
};

/// Mistral calls (v3 tokenizer, Mistral-7B-Instruct-v0.3, Mixtral, Mistral-Nemo):
pub static MISTRAL: Syntax = Syntax {
    markers: &["[TOOL_CALLS]"],
    lead: Some('['),
    list: true,
    close: None,
    separator: None,
    args_keys: &["arguments", "parameters"],
};

/// No markup: all text is content. What the shared parser would see of harmony, which
/// [`super::harmony`] parses instead.
pub static NONE: Syntax = Syntax {
    markers: &[],
    lead: None,
    list: false,
    close: None,
    separator: None,
    args_keys: &[],
};
