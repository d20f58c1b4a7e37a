// graphql-codegen's client preset over the "frontend" in src/: typed
// documents in gen/ and, with persistedDocuments, gen/persisted-documents.json
// (the manifest `cellgate serve --persisted-documents` loads). Run by run.sh.
import type { CodegenConfig } from '@graphql-codegen/cli';
import { addTypenameSelectionDocumentTransform } from '@graphql-codegen/client-preset';

const config: CodegenConfig = {
  schema: '../../schema/schema.graphql',
  documents: ['src/**/*.ts'],
  ignoreNoDocuments: false,
  generates: {
    './gen/': {
      preset: 'client',
      presetConfig: {
        // The manifest: { "sha256:<hex>": "<document text>" }, and each
        // generated document carries its id in `__meta__.hash`.
        persistedDocuments: true,
        // Fragment masking changes only the TypeScript types; off keeps the
        // generated code small.
        fragmentMasking: false,
      },
      // Apollo Client adds __typename to every selection set it sends; the
      // persisted documents must have it too so the text the server runs by
      // id is the one Apollo would send (the client preset's advice for
      // normalized caches).
      documentTransforms: [addTypenameSelectionDocumentTransform],
    },
  },
};

export default config;
