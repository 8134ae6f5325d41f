// Kiln console's code editor: CodeMirror 6 with a language mode per Kiln
// language. Bundled by esbuild (`npm run build`) into dist/editor.js, which
// kiln-api embeds; the console falls back to a <textarea> without it.
// Exposes window.KilnEditor.create(parent, { doc, lang, onRun }) ->
// { getValue(), setValue(text), setLanguage(lang), focus() }.
import { EditorView, basicSetup } from "codemirror";
import { Compartment, EditorState, Prec } from "@codemirror/state";
import { keymap } from "@codemirror/view";
import { indentWithTab } from "@codemirror/commands";
import { StreamLanguage, indentUnit } from "@codemirror/language";
import { python } from "@codemirror/lang-python";
import { javascript } from "@codemirror/lang-javascript";
import { c, cpp, java } from "@codemirror/legacy-modes/mode/clike";
import { rust } from "@codemirror/legacy-modes/mode/rust";
import { go } from "@codemirror/legacy-modes/mode/go";
import { d } from "@codemirror/legacy-modes/mode/d";
import { fortran } from "@codemirror/legacy-modes/mode/fortran";
import { r } from "@codemirror/legacy-modes/mode/r";
import { shell } from "@codemirror/legacy-modes/mode/shell";

// Full grammars (Lezer) for Python and JS/TS; the legacy stream modes,
// which are far smaller, for the rest. Kiln's canonical language names (the server's /health list) to modes.
const modes = {
  py: () => python(),
  js: () => javascript(),
  ts: () => javascript({ typescript: true }),
  c: () => StreamLanguage.define(c),
  cpp: () => StreamLanguage.define(cpp),
  java: () => StreamLanguage.define(java),
  // PHP's only CodeMirror 6 grammar brings HTML, CSS and JS along (~300 KB):
  // Java's C-like highlighting is close enough for a playground
  php: () => StreamLanguage.define(java),
  rs: () => StreamLanguage.define(rust),
  go: () => StreamLanguage.define(go),
  d: () => StreamLanguage.define(d),
  f90: () => StreamLanguage.define(fortran),
  r: () => StreamLanguage.define(r),
  bash: () => StreamLanguage.define(shell),
};

// One indent step per language, as its own style guides have it (basicSetup's
// default is 2 spaces): PEP 8's 4 for Python, Go's tab, 2 for JS/TS, shell,
// R and Fortran, 4 for the C family, Rust and D.
const indents = { py: "    ", go: "\t", js: "  ", ts: "  ", bash: "  ", r: "  ", f90: "  " };

function modeFor(lang) {
  const m = modes[lang];
  return [m ? m() : [], indentUnit.of(indents[lang] || "    ")];
}

function create(parent, opts) {
  const language = new Compartment();
  // Highest precedence: basicSetup's own keymap binds Mod-Enter (insert a
  // blank line) and would otherwise win.
  const run = opts.onRun
    ? Prec.highest(keymap.of([{ key: "Mod-Enter", run: () => { opts.onRun(); return true; } }]))
    : [];
  const view = new EditorView({
    parent,
    state: EditorState.create({
      doc: opts.doc || "",
      extensions: [
        run,
        basicSetup,
        keymap.of([indentWithTab]),
        language.of(modeFor(opts.lang)),
        EditorView.contentAttributes.of({ "aria-label": "Code" }),
        opts.nonce ? EditorView.cspNonce.of(opts.nonce) : [],
      ],
    }),
  });
  return {
    getValue: () => view.state.doc.toString(),
    setValue: (text) =>
      view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } }),
    setLanguage: (lang) => view.dispatch({ effects: language.reconfigure(modeFor(lang)) }),
    focus: () => view.focus(),
    kind: "codemirror",
  };
}

window.KilnEditor = { create };
