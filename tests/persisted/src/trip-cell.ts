import { graphql } from '../gen';

// One version of a trip's cell, addressed by its full key
// (rowKey, column, refKey): immutable, so cacheable forever.
export const TripCell = graphql(`
  query TripCell($rowKey: UUID!, $column: TripsColumn!, $refKey: Int64!) {
    trips {
      cell(rowKey: $rowKey, column: $column, refKey: $refKey) {
        ...CellFields
      }
    }
  }
`);

// The same read without a fragment: the plainest immutable document.
export const TripBaseVersion = graphql(`
  query TripBaseVersion($rowKey: UUID!, $refKey: Int64!) {
    trips {
      cell(rowKey: $rowKey, column: BASE, refKey: $refKey) {
        refKey
        body
      }
    }
  }
`);
